"""HF folders of architectures with no native reader, from the command line: read by transformers, attached, and
analysed by `show` and `heads`; hostile folders refused before anything is allocated."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf, loading  # noqa: E402
from multihead.cli import main  # noqa: E402
from multihead.modules import capture  # noqa: E402

from .archs import ARCHS  # noqa: E402


def _folder(tmp_path_factory, name: str, **config):
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp(name)
    cfg = transformers.AutoConfig.for_model(name, **{**ARCHS[name].config, "vocab_size": 300, **config})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder, safe_serialization=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat sat on the mat, and the dog sat on the log"] * 10, vocab_size=280)
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    return _folder(tmp_path_factory, "gpt_neox")


def test_the_registry_says_attached_and_the_model_equals_hf(neox):
    import transformers

    k = loading.kind(neox)
    assert k.route == "attached" and k.name == "lm"
    loaded = loading.load(neox)
    assert loaded.family == "hf:gpt_neox"
    ref = transformers.AutoModelForCausalLM.from_pretrained(neox).eval()
    ids = torch.tensor([loaded.detail.encode("the cat sat on the mat")])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids), ref(ids).logits, atol=1e-5, rtol=1e-5)
        # head_mask zeroes a head's output as multihead's own LMs do
        mask = torch.ones(2, 4)
        mask[1, 2] = 0
        with capture(loaded.model, ("z",)) as cache:
            masked = loaded.model(ids, head_mask=mask)
        assert not torch.equal(masked, loaded.model(ids))
        assert cache.get_layer("z", 1)[:, 2].abs().max() > 0  # hook_z sees the output before the mask, as ours


def test_heads_from_maps_and_from_statistics_agree(neox, tmp_path):
    a, b = tmp_path / "maps", tmp_path / "stats"
    assert main(["heads", str(neox), "--n", "2", "--max-len", "48", "--from", "maps", "--out", str(a)]) == 0
    assert main(["heads", str(neox), "--n", "2", "--max-len", "48", "--from", "stats", "--out", str(b)]) == 0
    ra, rb = (json.loads((f / "heads.json").read_text()) for f in (a, b))
    assert len(ra["heads"]) == 8
    assert [h["role"] for h in ra["heads"]] == [h["role"] for h in rb["heads"]]
    for x, y in zip(ra["heads"], rb["heads"]):
        assert abs(x["to_first"] - y["to_first"]) < 1e-3 and abs(x["entropy"] - y["entropy"]) < 1e-3


def test_show_writes_the_page(neox, tmp_path, capsys):
    out = tmp_path / "show"
    assert main(["show", str(neox), "the cat sat on the mat", "--out", str(out)]) == 0
    assert (out / "attention.html").stat().st_size > 0
    assert "gpt_neox: no native multihead family; read with transformers and attached" in capsys.readouterr().err


def test_an_attached_lm_refuses_only_what_no_causal_lm_does(neox, capsys):
    assert loading.REFUSES["attached"] == loading.REFUSES["lm"]
    assert main(["embed", str(neox), "a text"]) == 2
    assert "sentence embeddings take an encoder" in capsys.readouterr().err


def test_generate_continues_as_hf_does(neox, capsys):
    import transformers

    p = loading.load(neox).detail
    ids = torch.tensor([p.encode("the cat sat")])
    ref = transformers.AutoModelForCausalLM.from_pretrained(neox).eval()
    want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0)
    streamed = []
    got = p.model.generate(ids, max_new_tokens=6, streamer=lambda t, alive: streamed.append(int(t[0])))
    assert got[0].tolist() == want[0, ids.shape[1] :].tolist() == streamed
    linears = [m for m in p.model.hf.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.stride(0) == 1 for m in linears)  # laid out for decoding: HF's tokens still
    assert main(["generate", str(neox), "the cat sat", "--max-new", "6", "--no-stream"]) == 0
    assert capsys.readouterr().out.strip() == "the cat sat" + p.tokenizer.decode(streamed, skip_special_tokens=True)


def test_generate_compile_refuses_an_attached_folder_multihead_does_not_read(neox, capsys):
    assert main(["generate", str(neox), "the cat sat", "--max-new", "2", "--compile"]) == 2
    err = capsys.readouterr().err
    assert "--compile compiles multihead's own decoding step" in err and "drop --compile" in err
    assert "decodes through HF's own layers" in err
    assert "Traceback" not in err


def test_patch_and_induction_from_the_command_line(neox, tmp_path):
    out = tmp_path / "patch"
    argv = ["patch", str(neox), "--clean", "the cat sat on the mat", "--corrupt", "the dog sat on the mat"]
    assert main([*argv, "--answer", " the", "--wrong", " mat", "--out", str(out)]) == 0
    r = json.loads((out / "importance-patching.json").read_text())
    assert torch.tensor(r["effect"]).shape == (2, 4) and torch.isfinite(torch.tensor(r["effect"])).all()
    ind = tmp_path / "induction"
    assert (
        main(["induction", "--model", str(neox), "--out", str(ind), "--half", "6", "--batch", "2", "--ablate", "2"])
        == 0
    )
    s = json.loads((ind / "induction.json").read_text())
    assert torch.tensor(s["prefix_matching"]).shape == (2, 4)
    assert torch.tensor(s["copying"]).isnan().all()  # GPT-NeoX fuses q, k and v: no separate value projection


def test_attribute_splits_the_logit_difference(neox, capsys):
    assert main(["attribute", str(neox), "the cat sat on the", "--answer", " mat", "--wrong", " log", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(r["check"]["sum_of_parts"] - r["check"]["logit_difference"]) < 1e-4
    assert torch.tensor(r["heads"]).shape == (2, 4)


def test_hostile_folders(tmp_path_factory, tmp_path, capsys):
    # an architecture nobody knows
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "nonsense_arch", "hidden_size": 8}))
    assert main(["heads", str(unknown), "--n", "1"]) == 2
    assert "'nonsense_arch' is not an architecture transformers" in capsys.readouterr().err

    # absurd sizes: refused from the parameter count on the meta device, before anything is allocated
    import resource

    huge = _folder(tmp_path_factory, "gpt_neox")
    cfg = json.loads((huge / "config.json").read_text())
    cfg.update(hidden_size=1 << 20, intermediate_size=1 << 22, num_hidden_layers=64)
    (huge / "config.json").write_text(json.dumps(cfg))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["heads", str(huge), "--n", "1"]) == 2
    assert "over the ceiling" in capsys.readouterr().err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 2 * 1024 * 1024  # KiB: under 2 GiB more

    # pickle weights only: not opened
    pickled = _folder(tmp_path_factory, "gpt_neox")
    for f in pickled.glob("*.safetensors"):
        f.rename(f.with_name("pytorch_model.bin"))
    with pytest.raises(hf.AttachError, match="a pickle file\\), which multihead does not open"):
        loading.load(pickled)

    # a vision folder is read as one: heads (text) refused from its config, show --image needs its weights
    vit = tmp_path / "vit"
    vit.mkdir()
    (vit / "config.json").write_text(json.dumps({"model_type": "vit"}))
    assert main(["heads", str(vit), "--n", "1"]) == 2
    assert "show --image" in capsys.readouterr().err
    assert main(["show", str(vit), "--image", "x.png", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "internal error" not in err


@pytest.mark.parametrize(
    "edit", [{"num_attention_heads": 0}, {"hidden_size": "wide"}, {"num_hidden_layers": -3}, {"vocab_size": None}]
)
def test_a_config_transformers_cannot_build_is_refused(tmp_path_factory, capsys, edit):
    folder = _folder(tmp_path_factory, "gpt_neox")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **edit}))
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert main(["heads", str(folder), "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err and str(folder) in err
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # nothing written into it


def test_heads_kv_takes_an_attached_folder(tmp_path_factory, tmp_path, capsys):
    """The KV head scores read only hook_pattern, which attached layers have: --kv works on an attached folder."""
    folder = _folder(tmp_path_factory, "gpt_neox", max_position_embeddings=512)
    out = tmp_path / "kvheads"
    assert main(["heads", str(folder), "--kv", "--needles", "0", "--out", str(out)]) == 0
    r = json.loads((out / "kv-heads.json").read_text())
    assert len(r["heads"]) == 8 and len(r["split"]["full_heads"]) == 2
    assert "is not" not in capsys.readouterr().err
