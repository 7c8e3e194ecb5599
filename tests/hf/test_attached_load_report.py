"""An HF folder read with transformers and attached is the model in its files, or it is refused by name: no weight
missing (random-initialised), extra (ignored), integer (cast) or non-finite; no quantised checkpoint read as floats;
no seq2seq, multimodal or encoder folder run as a decoder alone; no weight file that is not whole safetensors."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import loading  # noqa: E402
from multihead.cli import main  # noqa: E402
from multihead.hf.attach import attached as attach_record  # noqa: E402
from multihead.hf import folder as hf_folder  # noqa: E402
from multihead.pretrained import SourceError  # noqa: E402

from .archs import ARCHS  # noqa: E402


def _tokenizer(folder) -> None:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat sat on the mat, and the dog sat on the log"] * 10, vocab_size=280)
    tok.save(str(folder / "tokenizer.json"))


def _save(folder, name: str, cls: str = "AutoModelForCausalLM", **config):
    import transformers

    cfg = transformers.AutoConfig.for_model(name, **{**ARCHS[name].config, "vocab_size": 300, **config})
    torch.manual_seed(0)
    getattr(transformers, cls).from_config(cfg).save_pretrained(folder, safe_serialization=True)
    _tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("neox"), "gpt_neox")


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _edit_tensors(folder, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path, metadata={"format": "pt"})


def _refused(folder, *words) -> str:
    with pytest.raises(SourceError) as err:
        hf_folder.load(folder)
    for w in words:
        assert w in str(err.value), str(err.value)
    return str(err.value)


def test_the_folder_as_saved_loads(neox):
    assert loading.load(neox).family == "hf:gpt_neox"


@pytest.mark.parametrize("name", ["gpt_neox.layers.0.attention.query_key_value.weight", "embed_out.weight"])
def test_a_missing_weight_is_refused_by_name(neox, tmp_path, name):
    folder = _copy(neox, tmp_path / "f")
    _edit_tensors(folder, lambda s: s.pop(name))
    msg = _refused(folder, "missing from the files")
    # named as the file names it (transformers 5 calls GPT-NeoX's embed_out lm_head)
    assert name in msg or (name == "embed_out.weight" and "lm_head.weight" in msg), msg


def test_an_extra_tensor_is_refused_by_name(neox, tmp_path):
    folder = _copy(neox, tmp_path / "f")
    extra = "gpt_neox.layers.7.attention.dense.weight"
    _edit_tensors(folder, lambda s: s.__setitem__(extra, torch.zeros(64, 64)))
    _refused(folder, extra, "not in the model")


@pytest.mark.parametrize(
    "name,value",
    [("gpt_neox.layers.1.mlp.dense_h_to_4h.weight", float("nan")), ("gpt_neox.embed_in.weight", float("inf"))],
)
def test_non_finite_weights_are_refused_by_name(neox, tmp_path, name, value):
    folder = _copy(neox, tmp_path / "f")
    _edit_tensors(folder, lambda s: s[name].fill_(value))
    _refused(folder, name, "non-finite")


def test_integer_weights_are_refused_by_name(neox, tmp_path):
    folder = _copy(neox, tmp_path / "f")
    name = "gpt_neox.layers.0.mlp.dense_4h_to_h.weight"
    _edit_tensors(folder, lambda s: s.__setitem__(name, s[name].to(torch.int32)))
    _refused(folder, name, "I32")


@pytest.mark.parametrize(
    "quant", [{"quant_method": "bitsandbytes", "load_in_4bit": True}, {"quant_method": "gptq", "bits": 4}]
)
def test_quantised_folders_are_refused_before_anything_is_read(neox, tmp_path, quant, capsys):
    folder = _copy(neox, tmp_path / "f")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    _refused(folder, "quantised", quant["quant_method"])
    assert main(["heads", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "quantised checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpt_neox", "llama"])  # attached, and a native family
def test_a_folder_naming_its_own_code_is_refused_and_the_code_never_runs(name, tmp_path, capsys):
    folder = _save(tmp_path / "f", name)
    marker = tmp_path / "ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    cfg = json.loads((folder / "config.json").read_text())
    auto_map = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilLM"}
    (folder / "config.json").write_text(json.dumps({**cfg, "auto_map": auto_map}))
    for argv in (["heads", str(folder), "--out", str(tmp_path / "out")], ["generate", str(folder), "hello"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "modeling_evil.EvilLM" in err and "never runs code" in err, err
    with pytest.raises(SourceError, match="auto_map"):
        loading.load(folder)
    assert not marker.exists()


def test_a_symlink_to_a_text_file_a_cut_file_and_a_huge_header_are_refused(neox, tmp_path, capsys):
    link = _copy(neox, tmp_path / "link")
    os.unlink(link / "model.safetensors")
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n" * 20)
    os.symlink(passwd, link / "model.safetensors")
    cut = _copy(neox, tmp_path / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    huge = _copy(neox, tmp_path / "huge")
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**30, 2**30], "data_offsets": [0, 2**62]}}).encode()
    (huge / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    for folder in (link, cut, huge):
        _refused(folder, "model.safetensors")
        assert main(["generate", str(folder), "hello", "--max-new", "2"]) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "internal error" not in err


def test_config_json_that_is_a_device_is_refused_without_reading(neox, tmp_path, capsys):
    folder = _copy(neox, tmp_path / "f")
    os.unlink(folder / "config.json")
    os.symlink("/dev/zero", folder / "config.json")
    assert main(["heads", str(folder), "--out", str(tmp_path / "o")]) == 2
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["bart", "marian"])
def test_a_seq2seq_folder_is_never_read_as_its_decoder_alone(tmp_path, name, capsys):
    folder = _save(tmp_path / name, name, "AutoModelForSeq2SeqLM")
    msg = _refused(folder, "sequence-to-sequence", "encoder")  # the causal-LM reader refuses it
    assert "ForCausalLM" in msg
    # the registry reads it as what it is: the whole model, encoder included
    assert loading.kind(folder).route == "attached-seq2seq"
    assert type(loading.load(folder).detail.hf).__name__ in ("BartForConditionalGeneration", "MarianMTModel")
    for argv in (["sinks", str(folder)], ["circuit", "ioi", str(folder), "--out", str(tmp_path / "c")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "sequence-to-sequence" in err and "internal error" not in err


@pytest.mark.parametrize("name", ["mbart", "pegasus"])
def test_other_seq2seq_types_in_the_causal_table_are_refused_from_the_config(name):
    assert "sequence-to-sequence" in hf_folder._why_not_type(name, {"model_type": name})


def test_a_multimodal_config_is_refused_from_the_config():
    why = hf_folder._why_not_type("mllama", {"model_type": "mllama", "vision_config": {}, "text_config": {}})
    assert why is not None and "vision_config" in why


@pytest.mark.parametrize(
    "name,archs",
    [("roberta", ["RobertaModel"]), ("electra", ["ElectraModel"]), ("roberta", None), ("bert", ["BertForMaskedLM"])],
)
def test_an_encoder_folder_is_never_read_as_a_causal_lm(name, archs):
    cfg = {"model_type": name, **({"architectures": archs} if archs else {})}
    why = hf_folder._why_not_type(name, cfg)
    assert why is not None and "is an encoder" in why
    # the decoder variant, named as such, is a causal LM
    assert hf_folder._why_not_type(name, {"model_type": name, "architectures": [f"{name.title()}ForCausalLM"]}) is None


def test_generate_with_output_attentions_returns_the_maps_as_eager(neox):
    import transformers

    loaded = loading.load(neox)
    hf = loaded.model.hf
    ref = transformers.AutoModelForCausalLM.from_pretrained(neox, attn_implementation="eager").eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    kw = dict(max_new_tokens=3, do_sample=False, output_attentions=True, return_dict_in_generate=True, pad_token_id=0)
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ours = hf.generate(ids, **kw)
    assert not [w for w in seen if "output_attentions" in str(w.message)]  # no "only eager returns them" warning
    theirs = ref.generate(ids, **kw)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(ours.attentions) == len(theirs.attentions) == 3
    for step_ours, step_theirs in zip(ours.attentions, theirs.attentions):
        for a, b in zip(step_ours, step_theirs):
            assert a is not None
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # a call without the flag returns none, and leaves nothing asking
    assert hf(ids).attentions is None and attach_record(loaded.model.hf).asking == 0


def test_transformers_load_warnings_are_not_silenced(neox):
    """Loading attached leaves transformers' logging as the user set it: its own load warnings reach the user."""
    import transformers

    transformers.logging.set_verbosity_warning()
    loading.load(neox)
    assert transformers.logging.get_verbosity() == transformers.logging.WARNING
