"""The workbench verbs on HF models read by transformers and attached: importance and pruning (heads removed from the
weights, saved as an HF folder plain transformers loads) agree with multihead's native reading of the same Llama
folder (``hf:FOLDER`` asks for the attached reading), and pruning refuses what it cannot slice, by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf, loading  # noqa: E402
from multihead.cli import main  # noqa: E402
from multihead.hf.folder import AttachedLM  # noqa: E402
from multihead.hf.heads import prune_heads, save_pruned  # noqa: E402

from .archs import ARCHS  # noqa: E402
from .test_attached_load_report import _save  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def granite(tmp_path_factory):  # GQA, separate projections, no native family
    return _save(tmp_path_factory.mktemp("granite"), "granite")


def test_hf_prefix_reads_a_native_family_attached(llama):
    assert loading.kind(llama).route == "lm"  # native
    k = loading.kind(f"hf:{llama}")
    assert k.route == "attached" and k.path == llama
    assert loading.load(f"hf:{llama}").family == "hf:llama"
    from multihead.pretrained import SourceError

    with pytest.raises(SourceError, match="no config.json"):
        loading.kind(f"hf:{llama / 'nowhere'}")


def test_importance_attached_equals_native(llama, tmp_path, capsys):
    outs = {}
    for name, source in (("native", str(llama)), ("attached", f"hf:{llama}")):
        assert main(["importance", source, "--out", str(tmp_path / name), "--n", "2"]) == 0
        outs[name] = json.loads((tmp_path / name / "importance-michel.json").read_text())
    assert "as asked (hf:FOLDER)" in capsys.readouterr().err
    a, b = (torch.tensor(outs[n]["importance"]) for n in ("native", "attached"))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert outs["native"]["perplexity"] == pytest.approx(outs["attached"]["perplexity"], rel=1e-4)


def test_pruning_removes_whole_groups_and_the_saved_folder_is_the_masked_model(granite, tmp_path, capsys):
    out = tmp_path / "pruned"
    argv = ["prune", str(granite), "--out", str(out), "--n", "2", "--fractions", "0.5", "--save"]
    assert main(argv) == 0
    assert "read back by transformers" in capsys.readouterr().out
    report = json.loads((out / "importance-michel.json").read_text())
    chosen = {int(k): v for k, v in report["fractions"]["0.5"]["pruned_heads"].items()}
    assert sum(len(v) for v in chosen.values()) == 4  # half of 2 layers x 4 query heads, whole groups of 2
    for hs in chosen.values():
        assert len(hs) % 2 == 0 and all(hs[i] // 2 == hs[i + 1] // 2 for i in range(0, len(hs), 2))
    # plain transformers reads the saved folder; its logits are the original model's with those heads masked
    saved = transformers.AutoModelForCausalLM.from_pretrained(out / "pruned-0.5").eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(granite).eval()
    hf.attach(original)
    mask = torch.ones(2, 4)
    for layer, hs in chosen.items():
        mask[layer, hs] = 0
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        masked = AttachedLM(original, 0)(ids, head_mask=mask)
        torch.testing.assert_close(saved(input_ids=ids).logits, masked, atol=1e-5, rtol=1e-5)
    stored = sum(p.numel() for p in saved.parameters())
    assert stored < sum(p.numel() for p in original.parameters()) or len(chosen) < 2


def test_prune_refusals_name_the_reason(tmp_path):
    model = ARCHS["granite"].build()
    hf.attach(model)
    with pytest.raises(ValueError, match=r"query heads \[0, 1\] share key/value head 0"):
        prune_heads(model, {0: [0]})
    with pytest.raises(ValueError, match="leaves no attention"):
        prune_heads(model, {0: [0, 1, 2, 3]})
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        prune_heads(model, {5: [0, 1]})
    assert prune_heads(model, {1: [0, 1]}) == {1: [2, 3]}
    with pytest.raises(ValueError, match="leaves no attention"):  # indices as they are now: one group is left
        prune_heads(model, {1: [0, 1]})
    for name, words in (("gpt2", "fused layout"), ("olmo2", "normalises across all heads")):
        other = ARCHS[name].build()
        hf.attach(other)
        with pytest.raises(hf.AttachError, match=words):
            prune_heads(other, {0: [0]})
    folder = save_pruned(model, tmp_path / "saved")
    assert folder["kept"] == {"1": [2, 3]} and folder["heads_per_layer"] == 4


def test_sinks_attached_equals_native_under_every_cache(llama, tmp_path):
    outs = {}
    for name, source in (("native", str(llama)), ("attached", f"hf:{llama}")):
        argv = ["sinks", source, "--length", "40", "--window", "12", "--sinks", "4", "--band", "12", "--texts", "2"]
        assert main([*argv, "--out", str(tmp_path / name)]) == 0
        outs[name] = json.loads((tmp_path / name / "sinks.json").read_text())
    for policy in ("full", "window", "sinks"):
        a, b = (outs[n]["policies"][policy] for n in ("native", "attached"))
        assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-4), policy
        torch.testing.assert_close(torch.tensor(a["first_share"]), torch.tensor(b["first_share"]), atol=1e-4, rtol=0)
    # the policies differ: with 40 tokens and 16 slots the window and the sinks caches evict
    full, window = (outs["attached"]["policies"][p]["bands"][-1]["perplexity"] for p in ("full", "window"))
    assert full != window


def test_a_stream_cache_refuses_what_it_cannot_do():
    from multihead.hf.stream import StreamCache

    model = ARCHS["gemma3_text"].build()
    hf.attach(model)
    with pytest.raises(hf.AttachError, match="several rotary embeddings|depends on the layer type"):
        StreamCache(model, window=8, sinks=4)
    StreamCache(model)  # the full cache needs no rotation
    llama = ARCHS["llama"].build()
    hf.attach(llama)
    lm = AttachedLM(llama, 0)
    cache = lm.new_cache(window=4, sinks=1)
    with pytest.raises(ValueError, match="more than the cache's 5 slots"):
        lm(torch.ones(1, 6, dtype=torch.long), cache=cache)
    lm(torch.ones(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="one token per step"):
        lm(torch.ones(1, 2, dtype=torch.long), cache=cache)


def test_export_of_a_pruned_attached_model_loads_in_plain_transformers(granite, tmp_path, capsys):
    report = tmp_path / "prune"
    assert main(["prune", str(granite), "--out", str(report), "--n", "2", "--fractions", "0.25", "0.5"]) == 0
    out = tmp_path / "exported"
    assert main(["export", str(granite), "--out", str(out), "--prune", str(report)]) == 2
    assert "pass --fraction, one of 0.25, 0.5" in capsys.readouterr().err
    assert main(["export", str(granite), "--out", str(out), "--prune", str(report), "--fraction", "0.25"]) == 0
    assert "heads removed" in capsys.readouterr().out
    heads = json.loads((report / "importance-michel.json").read_text())["fractions"]["0.25"]["pruned_heads"]
    saved = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(granite).eval()
    hf.attach(original)
    mask = torch.ones(2, 4)
    for layer, hs in heads.items():
        mask[int(layer), hs] = 0
    ids = torch.randint(3, 300, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(saved(input_ids=ids).logits, AttachedLM(original, 0)(ids, head_mask=mask))
    assert (out / "tokenizer.json").is_file()
    # a native reading has one head count for every layer: a pruned export asks for the attached reading
    llama = _save(tmp_path / "llama", "llama")
    argv = ["export", str(llama), "--out", str(tmp_path / "x"), "--prune", str(report), "--fraction", "0.25"]
    assert main(argv) == 2
    assert "hf:FOLDER" in capsys.readouterr().err


def test_circuit_and_explain_attached_equal_native(llama):
    from multihead.interpret.causal import circuits as C
    from multihead.interpret import load_subject
    from multihead.interpret.pages.explain import explain

    native, attached_ = loading.load(llama).detail, loading.load(f"hf:{llama}").detail
    runs = [
        C.induction_circuit(p.model, start=5, low=5, half=6, sequences=2, receivers=[(1, 0)], senders=[(0, 1)])
        for p in (native, attached_)
    ]
    for key in ("prefix_matching", "previous_token"):
        torch.testing.assert_close(torch.tensor(runs[0][key]), torch.tensor(runs[1][key]), atol=1e-5, rtol=1e-5)
    for key in runs[0]["mean"]:
        assert runs[0]["mean"][key] == pytest.approx(runs[1]["mean"][key], abs=1e-4), key
    pages = [explain(load_subject(s), "the cat sat on the mat", layer=1, head=2) for s in (str(llama), f"hf:{llama}")]
    for key in ("X", "Q", "K", "V", "weights", "concat", "output"):
        torch.testing.assert_close(torch.tensor(pages[0][key]), torch.tensor(pages[1][key]), atol=1e-4, rtol=0)
    assert max(pages[1]["checks"].values()) < 1e-4 and pages[1]["rotated"]


@pytest.mark.parametrize(
    "report, words",
    [
        ({"fractions": {"0.5": {"pruned_heads": {"0": ["a"]}}}}, "lists of head indices"),
        ({"fractions": {"0.5": {}}}, "lists of head indices"),
        ({"fractions": {"0.5": {"pruned_heads": {"x": [0]}}}}, "lists of head indices"),
        ({"fractions": {"half": {}}}, "pass --fraction, one of half"),
        ({"fractions": []}, "holds no pruned fractions"),
        ([1, 2], "holds no pruned fractions"),
    ],
)
def test_a_bad_pruning_report_is_refused_before_loading(granite, tmp_path, capsys, report, words):
    (tmp_path / "prune").mkdir()
    (tmp_path / "prune" / "importance-michel.json").write_text(json.dumps(report))
    out = tmp_path / "out"
    argv = ["export", str(granite), "--out", str(out), "--prune", str(tmp_path / "prune"), "--fraction", "0.5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and "internal error" not in err, err
    assert not out.exists()
    assert main([*argv[:-4], "--prune", str(tmp_path / "nowhere"), "--fraction", "0.5"]) == 2
    assert "pass the --out folder of `multihead prune MODEL`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv[:-1], "2"])
    assert "a number in [0, 1]" in capsys.readouterr().err
