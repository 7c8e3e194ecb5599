"""Importance, pruning: physical == masked, a planted head ranks first, whole layers, save/load, the CLI."""

import json

import pytest
import torch

import multihead as mh
from multihead.cli import main
from multihead.heads import scores as importance
from multihead.heads.prune import mask_to_heads, prune_curve


def _model(**kw):
    torch.manual_seed(0)
    return mh.TransformerClassifier(60, 32, 4, 3, 3, dropout=0.0, **kw).eval()


def _batch(b=5, l=13):
    ids = torch.randint(4, 60, (b, l))
    keep = torch.arange(l)[None, :] < torch.tensor([l, 9, 4, 13, 1])[:b, None]
    return ids.masked_fill(~keep, 0), keep


@pytest.mark.parametrize("kv", [None, 2], ids=["mha", "gqa"])
def test_physically_pruned_equals_masked(kv):
    model = _model(num_kv_heads=kv)
    ids, keep = _batch()
    heads = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2, 3]} if kv else {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}
    mask = torch.ones(3, 4)
    for layer, hs in heads.items():
        mask[layer, hs] = 0
    with torch.no_grad():
        masked = model(ids, keep, head_mask=mask)
        model.encoder.prune_heads(heads)
        pruned = model(ids, keep)
    assert (pruned - masked).abs().max().item() <= 1e-6
    assert model.encoder.num_heads == [4 - len(heads[0]), 0, 4 - len(heads[2])]
    assert model.config.encoder.pruned_heads == {k: sorted(v) for k, v in heads.items()}
    assert model.encoder.layers[1].attn.w_q.weight.shape == (0, 32)  # the whole layer's attention is gone
    if kv:
        assert model.encoder.layers[2].attn.num_kv_heads == 1  # both heads of one group removed: its K/V went too


def test_pruning_twice_uses_original_numbering_and_saves_through_the_config(tmp_path):
    model = _model()
    ids, keep = _batch()
    model.encoder.prune_heads({0: [1]})
    model.encoder.prune_heads({0: [3, 1]})  # 1 is already gone; 3 is the original head 3
    assert model.encoder.layers[0].attn.pruned_heads == [1, 3]
    with pytest.raises(ValueError, match=r"heads 0..3 \(original numbering\)"):
        model.encoder.prune_heads({0: [7]})
    text = model.config.to_json()
    again = mh.TransformerClassifier.from_config(json.loads(text))  # the config rebuilds the pruned shapes
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(again.eval()(ids, keep), model(ids, keep))
    assert again.encoder.num_heads == [2, 4, 4]


def test_a_planted_decisive_head_ranks_first():
    model = _model()
    ids, keep = _batch()
    with torch.no_grad():  # only layer 0 head 2 and layer 2 head 1 reach the output
        for layer, keep_head in ((0, 2), (1, None), (2, 1)):
            w = model.encoder.layers[layer].attn.w_o.weight  # (E, H*D)
            for h in range(4):
                if h != keep_head:
                    w[:, h * 8 : (h + 1) * 8] = 0
        model.fc.weight.mul_(20)  # a confident model, and the labels are its own predictions: the task it solves
        labels = model(ids, keep).argmax(-1).tolist()
    data = ([row[: int(k.sum())] for row, k in zip(ids.tolist(), keep)], labels)
    for method in ("michel", "loo"):
        scores = importance.importance(model, *data, method)
        assert scores[0].argmax().item() == 2 and scores[2].argmax().item() == 1, method
        others = torch.cat([scores[0, [0, 1, 3]], scores[1], scores[2, [0, 2, 3]]])
        assert others.abs().max().item() < 1e-6, method
    michel = importance.importance(model, *data, "michel")
    assert torch.allclose(michel.norm(dim=1)[[0, 2]], torch.ones(2))  # L2-normalised per layer


def test_confidence_entropy_and_masked_heads_are_nan():
    model = _model()
    ids, keep = _batch()
    data = ([row[: int(k.sum())] for row, k in zip(ids.tolist(), keep)], [0, 1, 2, 0, 1])
    mask = torch.ones(3, 4)
    mask[1, 2] = 0
    for method in importance.METHODS:
        s = importance.importance(model, *data, method, mask)
        assert s.shape == (3, 4) and torch.isnan(s[1, 2]) and torch.isfinite(s[mask == 1]).all(), method
    conf = importance.importance(model, *data, "confidence")
    assert ((conf > 0) & (conf <= 1)).all()
    with pytest.raises(ValueError, match="unknown importance method"):
        importance.importance(model, *data, "magic")


def test_prune_curve_respects_max_drop():
    model = _model()
    ids, keep = _batch()
    data = ([row[: int(k.sum())] for row, k in zip(ids.tolist(), keep)], [0, 1, 2, 0, 1])
    r = prune_curve(model, data, data, step=0.25, max_drop=0.0, until=1.0, log=lambda *_: None)
    fractions = [x["fraction"] for x in r["rounds"]]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    chosen = next(x for x in r["rounds"] if x["mask"] == r["mask"])
    assert chosen["val_accuracy"] >= r["base_val_accuracy"] and r["pruned"] == chosen["pruned"]
    assert mask_to_heads([[1, 0], [1, 1], [0, 0]]) == {0: [1], 2: [0, 1]}


def test_prune_and_importance_cli_on_a_trained_run(tmp_path, sentiment_csv, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(sentiment_csv),
                "--out",
                str(run),
                "--epochs",
                "3",
                "--d-model",
                "16",
                "--heads",
                "4",
                "--layers",
                "2",
                "--d-ff",
                "32",
                "--vocab-size",
                "100",
                "--max-len",
                "24",
                "--text-column",
                "sentence",
                "--label-column",
                "sentiment",
                "--no-progress",
            ]
        )
        == 0
    )
    assert main(["importance", str(run), "--method", "michel"]) == 0
    assert (run / "importance" / "importance-michel.png").exists()
    payload = json.loads((run / "importance" / "importance-michel.json").read_text())
    assert len(payload["scores"]) == 2 and len(payload["scores"][0]) == 4
    out = tmp_path / "pruned"
    assert (
        main(["prune", str(run), "--out", str(out), "--max-drop", "0.02", "--min-time", "0.1", "--speed-at", "0.5"])
        == 0
    )
    result = json.loads((out / "pruning.json").read_text())
    assert result["max_abs_diff_pruned_vs_masked"] <= 1e-6
    assert result["parameters"]["pruned"] <= result["parameters"]["unpruned"]
    assert (out / "pruning.png").exists() and "pruned_50pct" in result["inference"]["seconds"]
    cfg = json.loads((out / "config.json").read_text())["train"]["model"]["encoder"]
    assert {int(k): v for k, v in (cfg["pruned_heads"] or {}).items()} == {
        int(k): v for k, v in result["pruned_heads"].items()
    }
    capsys.readouterr()
    assert main(["evaluate", str(out), "--json"]) == 0  # the pruned run loads and evaluates like any run
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(result["test_accuracy_pruned"])
    assert main(["prune", str(run), "--out", str(run)]) == 2


def test_sweep_cli_heads_and_kv_heads(tmp_path, sentiment_csv, capsys):
    common = [
        "--data",
        str(sentiment_csv),
        "--seeds",
        "2",
        "--epochs",
        "1",
        "--d-model",
        "16",
        "--d-ff",
        "32",
        "--vocab-size",
        "100",
        "--max-len",
        "24",
        "--limit",
        "60",
        "--eval-limit",
        "60",
        "--min-time",
        "0.05",
        "--text-column",
        "sentence",
        "--label-column",
        "sentiment",
    ]
    assert main(["sweep", "--heads", "1,4", "--out", str(tmp_path / "h"), *common]) == 0
    s = json.loads((tmp_path / "h" / "sweep.json").read_text())
    assert [r["heads"] for r in s["rows"]] == [1, 4] and [r["d_k"] for r in s["rows"]] == [16, 4]
    assert all(len(r["runs"]) == 2 and r["inference_seconds"] > 0 for r in s["rows"])
    assert len({u["seed"] for u in s["rows"][0]["runs"]}) == 2
    assert (tmp_path / "h" / "sweep.png").exists() and "best by mean: heads=" in capsys.readouterr().out
    assert (
        main(
            ["sweep", "--kv-heads", "4,1", "--set", "model.encoder.num_heads=4", "--out", str(tmp_path / "kv"), *common]
        )
        == 0
    )
    kv = json.loads((tmp_path / "kv" / "sweep.json").read_text())
    assert [r["kv_heads"] for r in kv["rows"]] == [4, 1]
    assert kv["rows"][1]["parameters"] < kv["rows"][0]["parameters"]  # MQA: one K/V projection of width d_k
    assert main(["sweep", "--heads", "3", "--out", str(tmp_path / "bad"), *common]) == 2
