"""HF encoder, sequence-to-sequence and vision folders from the command line: read with the class their config
names (never a seq2seq model as its decoder alone), and `show`, `heads`, `patch` and `generate` give what HF's own
eager model gives: every encoder, decoder and cross-attention map, the translation, the metric at the mask token."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf, loading  # noqa: E402
from multihead.cli import main  # noqa: E402

from .archs import ARCHS  # noqa: E402

WORDS = "the cat sat on mat a dog log paris is capital of france berlin germany".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "</s>"]


def _tokenizer(folder, template: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    if template == "bert":
        tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    else:
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 5)])
    tok.save(str(folder / "tokenizer.json"))


def _save(tmp_path_factory, name: str, cls: str, **config):
    import transformers

    folder = tmp_path_factory.mktemp(name)
    cfg = transformers.AutoConfig.for_model(name, **{**ARCHS[name].config, **config})
    torch.manual_seed(0)
    model = getattr(transformers, cls)(cfg)
    with torch.no_grad():  # weights large enough that heads differ (random init is near-uniform attention)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


S2S = {"vocab_size": 32, "pad_token_id": 0, "eos_token_id": 5, "decoder_start_token_id": 0}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {
        "roberta": _save(tmp_path_factory, "roberta", "RobertaForMaskedLM", vocab_size=32, pad_token_id=0),
        "bart": _save(tmp_path_factory, "bart", "BartForConditionalGeneration", **S2S, bos_token_id=2),
        "marian": _save(tmp_path_factory, "marian", "MarianMTModel", **S2S, decoder_vocab_size=32),
        "t5": _save(tmp_path_factory, "t5", "T5ForConditionalGeneration", **S2S),
        "vit": _save(tmp_path_factory, "vit", "ViTForImageClassification", num_labels=3),
    }
    _tokenizer(out["roberta"], "bert")
    for name in ("bart", "marian", "t5"):
        _tokenizer(out[name], "seq2seq")
    return out


def test_a_folder_whose_attention_bypasses_the_registry_is_attached_by_observation(folders):
    """Under transformers 4.57 T5 and RoBERTa compute attention outside the registry: observation serves them
    (under 5, the registry does); either way the folder reads and says which source served it."""
    import transformers

    outside = int(transformers.__version__.split(".")[0]) < 5
    for name in ("t5", "roberta"):
        att = hf.attached(loading.load(folders[name]).detail.hf)
        assert att.source == ("observed" if outside else "registry"), name
        assert (att.why_observed is not None) == outside and all(r.source == att.source for r in att.layers.values())


def _eager(folder, cls: str):
    import transformers

    return getattr(transformers, cls).from_pretrained(folder, attn_implementation="eager").eval()


def test_each_folder_is_read_as_what_its_config_says(folders):
    routes = {name: loading.kind(f).route for name, f in folders.items()}
    assert routes == {
        "roberta": "attached-encoder",
        "bart": "attached-seq2seq",
        "marian": "attached-seq2seq",
        "t5": "attached-seq2seq",
        "vit": "attached-vision",
    }
    loaded = loading.load(folders["marian"])
    assert type(loaded.detail.hf).__name__ == "MarianMTModel"  # the encoder and the decoder, never the decoder alone
    assert type(loading.load(folders["roberta"]).detail.hf).__name__ == "RobertaForMaskedLM"


@pytest.mark.parametrize("name", ["bart", "marian", "t5"])
def test_show_writes_every_encoder_decoder_and_cross_map_equal_to_hf_eager(folders, name, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "show"
    assert main(["show", str(folders[name]), "the cat sat on the mat", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    weights = load_file(out / "attention.safetensors")
    ref = _eager(folders[name], "AutoModelForSeq2SeqLM")
    with torch.no_grad():
        r = ref(
            input_ids=torch.tensor([summary["source_ids"]]),
            decoder_input_ids=torch.tensor([summary["output_ids"][:-1]]),
            output_attentions=True,
        )
        # the output is HF's own greedy translation
        again = ref.generate(
            input_ids=torch.tensor([summary["source_ids"]]), max_new_tokens=64, do_sample=False, num_beams=1
        )
    assert summary["output_ids"] == again[0].tolist()
    for kind, maps in (
        ("encoder", r.encoder_attentions),
        ("decoder", r.decoder_attentions),
        ("cross", r.cross_attentions),
    ):
        assert len(maps) == 2
        for l, w in enumerate(maps):
            torch.testing.assert_close(weights[f"{kind}_{l}"], w[0], atol=1e-5, rtol=1e-5)
    assert weights["cross_0"].shape[-1] == len(summary["source_ids"])  # output rows over source columns
    for f in ("cross.html", "encoder.html", "decoder.html", "cross_grid.png"):
        assert (out / f).is_file()


def test_heads_reads_the_three_kinds_over_a_data_set(folders, tmp_path):
    out = tmp_path / "heads"
    assert main(["heads", str(folders["bart"]), "--n", "3", "--out", str(out)]) == 0
    r = json.loads((out / "heads.json").read_text())
    assert r["texts"] == 3
    assert len(r["encoder"]["heads"]) == len(r["decoder"]["heads"]) == len(r["cross"]["heads"]) == 2 * 4
    for h in r["cross"]["heads"]:
        assert 0.0 <= h["monotonicity"] <= 1.0 and 0.0 <= h["entropy_norm"] <= 1.0 + 1e-6
    assert (out / "encoder_heads.png").is_file() and (out / "decoder_heads.png").is_file()


def test_generate_translates_with_the_encoder_as_hf_does(folders, capsys):
    from tokenizers import Tokenizer

    folder = folders["marian"]
    assert main(["generate", str(folder), "the cat sat", "--max-new", "6"]) == 0
    printed = capsys.readouterr().out.strip()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ref = _eager(folder, "AutoModelForSeq2SeqLM")
    ids = torch.tensor([tok.encode("the cat sat").ids])
    with torch.no_grad():
        out = ref.generate(input_ids=ids, max_new_tokens=6, do_sample=False, num_beams=1)
    assert printed == tok.decode(out[0].tolist(), skip_special_tokens=True)
    for argv, words in (
        (["generate", str(folder), "the cat", "--sample"], "greedily"),
        (["generate", str(folders["roberta"]), "the cat"], "show, heads and patch"),  # from the config alone
        (["heads", str(folders["vit"]), "--out", "x"], "show --image"),
        (["sinks", str(folders["bart"])], "decoder-only"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and "internal error" not in err, err


def test_show_on_an_encoder_folder_equals_hf_eager(folders, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "show"
    assert main(["show", str(folders["roberta"]), "the cat sat on the mat", "--out", str(out)]) == 0
    tokens = json.loads((out / "tokens.json").read_text())
    assert tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    weights = load_file(out / "attention.safetensors")
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    ids = torch.tensor([[vocab[t] for t in tokens]])
    with torch.no_grad():
        r = _eager(folders["roberta"], "RobertaForMaskedLM")(input_ids=ids, output_attentions=True)
    for l, w in enumerate(r.attentions):
        torch.testing.assert_close(weights[f"layer_{l}"], w[0], atol=1e-5, rtol=1e-5)
    # heads reads the same maps over a data set: a role for each of the 2 x 4 heads
    assert main(["heads", str(folders["roberta"]), "--n", "3", "--out", str(tmp_path / "heads")]) == 0
    assert len(json.loads((tmp_path / "heads" / "heads.json").read_text())["heads"]) == 8


def test_patch_on_a_masked_lm_reads_the_mask_token(folders, tmp_path):
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    out = tmp_path / "patch"
    clean, corrupt = "paris is the capital of [MASK]", "berlin is the capital of [MASK]"
    argv = ["patch", str(folders["roberta"]), "--clean", clean, "--corrupt", corrupt]
    assert main([*argv, "--answer", "france", "--wrong", "germany", "--out", str(out)]) == 0
    r = json.loads((out / "importance-patching.json").read_text())
    ref = _eager(folders["roberta"], "RobertaForMaskedLM")

    def diff(text: str) -> float:
        ids = [2, *(vocab[w] for w in text.split()), 3]
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([ids])).logits[0, len(ids) - 2]
        return float(logits[vocab["france"]] - logits[vocab["germany"]])

    assert r["per_pair"][0]["clean"] == pytest.approx(diff(clean), abs=1e-4)
    assert r["per_pair"][0]["corrupt"] == pytest.approx(diff(corrupt), abs=1e-4)
    assert len(r["effect"]) == 2 and len(r["layers"]) == 2
    assert (
        main(
            [
                *argv[:2],
                "--clean",
                "paris is the capital",
                "--corrupt",
                "berlin is the capital",
                "--answer",
                "france",
                "--wrong",
                "germany",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )


def test_patch_on_a_seq2seq_folder_reads_the_decoders_next_token(folders, tmp_path):
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    out = tmp_path / "patch"
    argv = ["patch", str(folders["bart"]), "--clean", "the cat sat", "--corrupt", "the dog sat", "--answer", "cat"]
    assert main([*argv, "--wrong", "dog", "--decoder", "the", "--out", str(out)]) == 0
    r = json.loads((out / "importance-patching.json").read_text())
    ref = _eager(folders["bart"], "AutoModelForSeq2SeqLM")
    with torch.no_grad():
        logits = ref(
            input_ids=torch.tensor([[vocab["the"], vocab["cat"], vocab["sat"], 5]]),
            decoder_input_ids=torch.tensor([[0, vocab["the"]]]),
        ).logits[0, -1]
    assert r["per_pair"][0]["clean"] == pytest.approx(float(logits[vocab["cat"]] - logits[vocab["dog"]]), abs=1e-4)
    assert len(r["layers"]) == 6  # 2 encoder, 2 decoder self- and 2 cross-attention layers


def test_show_on_a_vision_folder_equals_hf(folders, tmp_path):
    import numpy as np
    from PIL import Image

    from multihead.dinov2 import read_photo

    photo = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype("uint8")).save(photo)
    out = tmp_path / "show"
    assert main(["show", str(folders["vit"]), "--image", str(photo), "--out", str(out)]) == 0
    summary = json.loads((out / "image.json").read_text())
    folder = loading.load(folders["vit"]).detail
    _, x = folder.pixels(read_photo(photo))
    with torch.no_grad():
        probs = _eager(folders["vit"], "ViTForImageClassification")(pixel_values=x).logits.softmax(-1)[0]
    got = torch.tensor(list(summary["probabilities"].values()))
    torch.testing.assert_close(got, probs, atol=1e-4, rtol=0)
    assert (out / "attention.html").is_file() and (out / "cls_grid.png").is_file()


def test_bad_inputs_of_the_new_paths_are_refused_by_name_and_nothing_is_written(folders, tmp_path, capsys):
    import shutil

    import numpy as np
    from PIL import Image

    photo = tmp_path / "photo.png"
    Image.fromarray(np.zeros((20, 20, 3), dtype="uint8")).save(photo)
    vit = tmp_path / "vit"
    shutil.copytree(folders["vit"], vit)
    (vit / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5, "x", 0.5]}))
    out = tmp_path / "out"
    cases = [
        (["show", str(vit), "--image", str(photo), "--out", str(out)], "image_mean"),
        (["show", str(folders["vit"]), "--out", str(out)], "--image"),
        (["show", str(folders["bart"]), "  ", "--out", str(out)], "empty"),
        (
            [
                "patch",
                str(folders["roberta"]),
                "--clean",
                "a",
                "--corrupt",
                "b",
                "--answer",
                "cat",
                "--wrong",
                "dog",
                "--decoder",
                "the",
                "--out",
                str(out),
            ],
            "--decoder is for sequence-to-sequence",
        ),
        (["generate", str(folders["bart"]), ""], "pass one"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and "internal error" not in err, (argv, err)
        assert not out.exists() and not list(tmp_path.glob(".out.new*"))


def test_bench_kv_refuses_a_folder_that_is_no_model(tmp_path):
    from types import SimpleNamespace

    from multihead.bench import kv as K

    with pytest.raises(ValueError, match="HF causal-LM folder"):
        K.from_args(SimpleNamespace(model=str(tmp_path), lengths=None, context=None), tmp_path / "kv.json")
    assert not (tmp_path / "kv.json").exists()


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ('"image_mean": [NaN, 0.5, 0.5]', "finite"),
        ('"image_mean": [0.5, Infinity, 0.5]', "finite"),
        ('"image_std": [0.5, 0, 0.5]', "image_std must be positive"),
        ('"image_std": [NaN, 0.5, 0.5]', "finite"),
        ('"image_std": [1e-30, 0.5, 0.5]', "image_std must be positive"),
        ('"image_std": [true, 0.5, 0.5]', "three numbers"),
    ],
)
def test_non_finite_or_zero_normalisation_is_refused_by_name(folders, tmp_path, capsys, entry, said):
    """A ViT folder whose ``preprocessor_config.json`` holds NaN, Infinity or a zero standard deviation: ``show
    --image`` exits 2 naming the entry, and writes no NaN or Infinity anywhere."""
    import shutil

    import numpy as np
    from PIL import Image

    photo = tmp_path / "photo.png"
    Image.fromarray(np.zeros((20, 20, 3), dtype="uint8")).save(photo)
    vit = tmp_path / "vit"
    shutil.copytree(folders["vit"], vit)
    (vit / "preprocessor_config.json").write_text("{" + entry + "}")
    out = tmp_path / "out"
    assert main(["show", str(vit), "--image", str(photo), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and entry.split(":")[0].strip('"') in err and "Traceback" not in err
    assert not out.exists()
