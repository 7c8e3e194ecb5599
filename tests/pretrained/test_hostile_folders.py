"""Hostile HF model folders: configs nested thousands deep (arrays and objects), a tokenizer whose added tokens name
ids past the model's embeddings, generation and tokenizer configs of the wrong shape, a shard index naming numbers,
and byte flips and truncations of the safetensors header. Each is refused with a message naming the file (exit 2
from the command line, never a traceback); a flip either is refused or leaves the model exactly as it was."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from multihead import lm
from multihead._io import folder_kind
from multihead.cli import main
from multihead.pretrained import SourceError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))
from hf_families import hf_model  # noqa: E402


def _hf_folder(tmp_path_factory, family: str) -> Path:
    """A random HF folder of ``family`` with a byte-level BPE tokenizer of 280 tokens (the model has 300
    embeddings)."""
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("hf") / family
    hf_model(family).save_pretrained(out)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat sat on the mat"] * 10, vocab_size=280, min_frequency=1)
    tok.save(str(out / "tokenizer.json"))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random HF GPT-2 folder."""
    return _hf_folder(tmp_path_factory, "gpt2")


@pytest.fixture
def copy(folder, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(folder, dst)
    return dst


def _deep(kind: str, depth: int) -> str:
    return "[" * depth + "]" * depth if kind == "arrays" else '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind, depth", [("arrays", 5000), ("objects", 5000), ("objects", 900)])
def test_configs_nested_deeper_than_any_config_are_refused(copy, capsys, kind, depth):
    cfg = json.loads((copy / "config.json").read_text())
    text = json.dumps(cfg)[:-1] + f', "extra": {_deep(kind, depth)}}}'
    (copy / "config.json").write_text(text)
    with pytest.raises(SourceError, match="nests deeper than 64 levels"):
        lm.load(copy)
    for verb in (["generate", str(copy), "hi"], ["heads", str(copy)], ["attribute", str(copy), "hi", "--answer", "a"]):
        assert main(verb) == 2
        err = capsys.readouterr().err
        assert "nests deeper than 64 levels" in err and "internal error" not in err, err
    assert folder_kind(copy) == "other"  # as an --out folder: not ours, and no crash


@pytest.mark.parametrize("name", ["generation_config.json", "tokenizer_config.json"])
def test_the_other_configs_of_a_folder_are_held_to_the_same(copy, name):
    (copy / name).write_text(_deep("arrays", 3000))
    with pytest.raises(SourceError, match=f"{name} nests deeper"):
        lm.load(copy)
    (copy / name).write_text("[1, 2]")
    with pytest.raises(SourceError, match="not an object"):
        lm.load(copy)


def test_a_chat_template_that_is_not_text_is_refused(copy):
    (copy / "tokenizer_config.json").write_text(json.dumps({"chat_template": 5}))
    with pytest.raises(SourceError, match="is a int, not text"):
        lm.load(copy)


def test_added_tokens_past_the_embeddings_are_refused(copy):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(copy / "tokenizer.json"))
    tok.add_tokens([f"<extra_{i}>" for i in range(300 - tok.get_vocab_size() + 5)])  # 5 past the 300 embeddings
    tok.save(str(copy / "tokenizer.json"))
    assert tok.get_vocab_size() == 305
    with pytest.raises(SourceError, match="ids up to 304 but the model has 300 embeddings"):
        lm.load(copy)


def test_a_shard_index_naming_numbers_is_refused_from_the_command_line(copy, capsys):
    (copy / "model.safetensors").rename(copy / "shard.safetensors")
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte.weight": 1}}))
    assert main(["generate", str(copy), "hi"]) == 2
    err = capsys.readouterr().err
    assert "not a valid shard index" in err and "internal error" not in err


def _logits(path, ids):
    try:
        p = lm.load(path)
    except SourceError:
        return None
    with torch.no_grad():
        return p.model(ids)


@pytest.mark.timeout(300)
def test_byte_flips_in_the_safetensors_header_give_the_same_model_or_a_refusal(copy):
    """Any bit of the header (its length and the JSON naming every tensor's dtype, shape and byte range) flipped:
    refused, or exactly the same logits. Truncations anywhere are refused."""
    path = copy / "model.safetensors"
    raw = path.read_bytes()
    header = 8 + int.from_bytes(raw[:8], "little")
    ids = torch.arange(3, 23).reshape(1, 20)
    reference = _logits(copy, ids)
    rng = np.random.default_rng(0)
    for at in rng.choice(header, size=40, replace=False):
        bad = bytearray(raw)
        bad[int(at)] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(bad))
        out = _logits(copy, ids)
        assert out is None or torch.equal(out, reference), f"header byte {at} changed the model silently"
    for cut in sorted(rng.integers(1, len(raw), size=10)):
        path.write_bytes(raw[:cut])
        assert _logits(copy, ids) is None


# ------------------------------------------------------------------------------------------ weights as stored
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random HF Llama folder, read by multihead's own Llama family."""
    return _hf_folder(tmp_path_factory, "llama")


def _edited(src: Path, dst: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    edit(state)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_native_llama_with_non_finite_weights_is_refused_by_name(llama, tmp_path, capsys, value):
    name = "model.layers.1.self_attn.v_proj.weight"
    bad = _edited(llama, tmp_path / "m", lambda s: s[name].view(-1)[3:5].fill_(value))
    with pytest.raises(SourceError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight holds 2 non-finite"):
        lm.load(bad)
    assert main(["generate", str(bad), "the cat", "--max-new", "2"]) == 2
    assert "non-finite" in capsys.readouterr().err


def test_a_native_llama_with_integer_weights_is_refused_by_name(llama, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    bad = _edited(llama, tmp_path / "m", lambda s: s.__setitem__(name, (s[name] * 100).to(torch.int32)))
    with pytest.raises(SourceError, match=r"up_proj\.weight is stored as int32"):
        lm.load(bad)


@pytest.mark.parametrize("quant", [{"quant_method": "bitsandbytes", "load_in_8bit": True}, {"quant_method": "gptq"}])
def test_a_native_llama_with_a_quantization_config_is_refused_before_reading(llama, tmp_path, capsys, quant):
    bad = tmp_path / "m"
    shutil.copytree(llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    with pytest.raises(SourceError, match="quantised checkpoint"):
        lm.load(bad)
    for argv in (["generate", str(bad), "hi"], ["heads", str(bad)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "quantised checkpoint" in err and quant["quant_method"] in err
