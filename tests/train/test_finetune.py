"""Fine-tuning a pretrained encoder from the command line: the run folder works with evaluate/predict/embed/export."""

import json

import pytest
import torch

from multihead import pretrained
from multihead.cli import main
from multihead.train import finetune_config, load_run
from multihead.train.harness import param_groups


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, sentiment_csv):
    out = tmp_path_factory.mktemp("runs") / "ft"
    assert (
        main(
            [
                "train",
                "--init",
                "minilm",
                "--data",
                str(sentiment_csv),
                "--out",
                str(out),
                "--limit",
                "160",
                "--eval-limit",
                "160",
                "--epochs",
                "2",
                "--max-len",
                "32",
                "--text-column",
                "sentence",
                "--label-column",
                "sentiment",
                "--threads",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    return out


def test_run_records_the_pretrained_encoder(finetuned):
    cfg = json.loads((finetuned / "config.json").read_text())["train"]
    assert cfg["pretrained"]["name"] == "minilm"
    assert cfg["optim"]["lr"] == 1e-4 and cfg["optim"]["embed_init"] == "model"  # fine-tuning defaults
    m = cfg["model"]
    assert (m["vocab_size"], m["type_vocab_size"], m["embed_norm"]) == (30522, 2, True)
    assert (m["encoder"]["d_model"], m["encoder"]["num_heads"], m["encoder"]["num_layers"]) == (384, 12, 6)
    run = load_run(finetuned)
    assert run.tokenizer.get_vocab_size() == 30522  # MiniLM's WordPiece vocabulary, not a new one


def test_weights_start_from_the_checkpoint(finetuned):
    run = load_run(finetuned)
    base = pretrained.load("minilm").model.state_dict()
    tuned = run.model.state_dict()
    # A few optimizer steps at lr 1e-4 move weights by ~1e-3; a fresh init would differ by ~0.1 (init std 0.02).
    for name in ("pe.embedding.weight", "encoder.layers.0.attn.w_q.weight", "encoder.layers.5.ffn.w_2.weight"):
        assert (tuned[name] - base[name]).abs().max().item() < 0.02, name
    assert (tuned["encoder.layers.5.ffn.w_2.weight"] - base["encoder.layers.5.ffn.w_2.weight"]).abs().max() > 0


def test_evaluate_predict_embed_export_on_the_run(finetuned, capsys, tmp_path):
    assert main(["evaluate", str(finetuned), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    results = json.loads((finetuned / "results.json").read_text())
    assert ev["accuracy"] == pytest.approx(results["test"]["accuracy"])
    assert main(["predict", str(finetuned), "a good film", "an awful film"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [set(r["probabilities"]) for r in rows] == [{"negative", "positive"}] * 2
    assert main(["embed", str(finetuned), "a good film", "a bad film", "--out", str(tmp_path / "e.jsonl")]) == 0
    vecs = [json.loads(x)["embedding"] for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert len(vecs) == 2 and len(vecs[0]) == 384
    assert main(["export", str(finetuned), "--out", str(tmp_path / "hf")]) == 0
    back = pretrained.load(tmp_path / "hf")
    ids, mask = back.encode(["a good film"])
    with torch.no_grad():
        assert torch.allclose(back.model(ids, mask), load_run(finetuned).model.features(ids, mask)[0], atol=1e-5)


def test_layer_decay_gives_lower_rates_to_lower_layers():
    from multihead.models import ClassifierConfig, TransformerClassifier

    cfg = pretrained.encoder_config(pretrained.read_hf_config(pretrained.resolve("minilm")))
    model = TransformerClassifier.from_config(ClassifierConfig.from_dict({**cfg.to_dict(), "num_classes": 2}))
    oc = finetune_config("minilm").optim
    from multihead.train.trainer import _lr_scale

    groups = param_groups(model, oc.lr, oc.weight_decay, lr_scale=lambda name: _lr_scale(name, 6, 0.5))
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lr_of[id(named["fc.weight"])] == oc.lr
    assert lr_of[id(named["encoder.layers.5.attn.w_q.weight"])] == oc.lr * 0.5
    assert lr_of[id(named["encoder.layers.0.attn.w_q.weight"])] == oc.lr * 0.5**6
    assert lr_of[id(named["embed.weight"])] == oc.lr * 0.5**7
    assert sum(len(g["params"]) for g in groups) == len(named)


def test_embed_cli_prints_similarities(capsys):
    assert (
        main(
            [
                "embed",
                "minilm",
                "The cat sat on the mat.",
                "A cat was sitting on a rug.",
                "Stock markets fell sharply today.",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith("[")]
    sims = [[float(v) for v in r.split()[-3:]] for r in rows]
    assert sims[0][1] > 0.5 > sims[0][2]  # the two cat sentences are near, the market one is not


def test_bad_init_name_is_a_clear_error(capsys, tmp_path, sentiment_csv):
    assert (
        main(
            [
                "train",
                "--init",
                "bertbase",
                "--data",
                str(sentiment_csv),
                "--out",
                str(tmp_path / "x"),
                "--text-column",
                "sentence",
                "--label-column",
                "sentiment",
                "--no-progress",
            ]
        )
        == 2
    )
    assert "neither a known short name (minilm) nor a folder" in capsys.readouterr().err
