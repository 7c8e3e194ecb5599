"""Hostile input to the image commands (train --data digits|fashion_mnist, predict/evaluate/show/importance on a ViT
run) and the native encoder export: a message that names the fix, exit 2, no traceback, nothing written or changed."""

import numpy as np
import pytest

from multihead.cli import main
from robust_helpers import refused, run_cli, snapshot

SMALL = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--set",
    "model.encoder.d_ff=32",
    "--set",
    "model.patch_size=2",
    "--epochs",
    "1",
    "--threads",
    "1",
    "--no-progress",
    "--set",
    "run.baseline=false",
]


def _refused(argv, message):
    return refused(run_cli(*argv), message)


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "vit"
    assert main(["train", "--data", "digits", "--out", str(out), *SMALL]) == 0
    return out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "model.stem=foo"], "stem must be one of patch, conv"),
        (["--set", "model.patch_size=0"], "patch_size must be in [1, image_size]"),
        (["--set", "model.patch_size=3"], "image_size=8 is not divisible by patch_size=3"),
        (["--set", "model.pooling=max"], "pooling must be one of cls, mean"),
        (["--set", "model.positional=rope"], "positional must be one of learned, sincos"),
        (["--set", "model.positional=sincos", "--d-model", "18"], "not a multiple of 4"),
        (["--set", "model.stem_channels=0"], "stem_channels must be in [1, 4096]"),
        (["--set", "data.limit=2"], "data.limit must be >= 8"),
        (["--set", "data.shift=-1"], "data.shift must be in [0, 16]"),
        (["--d-model", "100000"], "model.encoder.d_model must be in"),
        (["--max-len", "64"], "data.max_len do not apply to image classification"),
        (["--resume", "--overwrite"], "pass one of them"),
    ],
)
def test_vision_config_is_checked_before_any_work(tmp_path, args, message):
    out = tmp_path / "run"
    _refused(["train", "--data", "digits", "--out", out, *SMALL, *args], message)
    assert not out.exists()


def test_fashion_mnist_missing_or_corrupt_is_named(tmp_path):
    _refused(
        ["train", "--data", "fashion_mnist", "--out", tmp_path / "r", "--set", f"data.path={tmp_path}"],
        "apt-get install dataset-fashion-mnist",
    )
    for split in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            (tmp_path / f"{split}-{kind}-ubyte").write_bytes(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"\0" * 2)
    _refused(
        ["train", "--data", "fashion_mnist", "--out", tmp_path / "r", "--set", f"data.path={tmp_path}"], "is truncated"
    )
    assert not (tmp_path / "r").exists()


def test_a_vit_run_is_not_replaced_without_overwrite(vit_run):
    before = snapshot(vit_run)
    _refused(["train", "--data", "digits", "--out", vit_run, *SMALL], "--resume to continue it")
    assert snapshot(vit_run) == before


def _images(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([object()], dtype=object), allow_pickle=True)
    np.save(tmp_path / "nan.npy", np.full((1, 8, 8), np.nan))
    np.save(tmp_path / "neg.npy", np.full((8, 8), -5.0))
    np.save(tmp_path / "rgb.npy", np.zeros((3, 8, 8), dtype=np.uint8))
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    (tmp_path / "x.txt").write_text("hi")


@pytest.mark.parametrize(
    "name, message",
    [
        ("obj.npy", "could not be read as an image"),  # an object array needs pickle: refused, never loaded
        ("nan.npy", "pixel values must be finite and in [0, 255]"),
        ("neg.npy", "pixel values must be finite and in [0, 255]"),
        ("rgb.npy", "resize it first"),
        ("bad.png", "could not be read as an image"),
        ("x.txt", "give a .png or .npy image"),
        ("missing.npy", "could not be read as an image"),
    ],
)
def test_bad_images_are_refused_by_predict_and_show(vit_run, tmp_path, name, message):
    _images(tmp_path)
    before = snapshot(vit_run)
    _refused(["predict", vit_run, "--image", tmp_path / name], message)
    _refused(["show", vit_run, "--image", tmp_path / name, "--out", tmp_path / "show"], message)
    assert not (tmp_path / "show").exists() and snapshot(vit_run) == before


@pytest.mark.parametrize(
    "argv, message",
    [
        (["predict", "RUN"], "pass --index N"),
        (["predict", "RUN", "--index", "-1"], "an integer >= 0"),
        (["predict", "RUN", "--index", "100000"], "outside the test split"),
        (["show", "RUN", "--out", "OUT"], "pass one image"),
        (["show", "RUN", "--index", "1", "--image", "x.png", "--out", "OUT"], "pass one image"),
        (["show", "RUN", "--index", "1", "--patch", "a,b", "--out", "OUT"], "--patch takes ROW,COL"),
        (["show", "RUN", "--index", "1", "--patch", "9,9", "--out", "OUT"], "outside the 4x4 patch grid"),
        (["show", "RUN", "--index", "1", "--out", "RUN"], "the folder being read"),
        (["evaluate", "RUN", "--split", "all"], "train, validation or test for an image run"),
        (["importance", "RUN", "--data", "rotten_tomatoes", "--out", "OUT"], "scored on its own data"),
    ],
)
def test_vit_run_commands_refuse_bad_arguments(vit_run, tmp_path, argv, message):
    before = snapshot(vit_run)
    out = tmp_path / "out"
    _refused([vit_run if a == "RUN" else out if a == "OUT" else a for a in argv], message)
    assert not out.exists() and snapshot(vit_run) == before


def test_a_native_encoder_folder_that_lies_is_refused(tmp_path):
    """`--init` on an encoder folder in multihead's own layout whose config section is broken: a message, no run."""
    import json

    from multihead import pretrained
    from multihead.models.text_encoder import TextEncoder, TextEncoderConfig
    from multihead.modules.encoder import EncoderConfig

    tok = pretrained.load_tokenizer(pretrained.resolve("minilm"))
    enc = TextEncoder(
        TextEncoderConfig(
            vocab_size=tok.get_vocab_size(),
            max_len=16,
            positional="rope",
            encoder=EncoderConfig(d_model=16, num_heads=2, num_layers=1, d_ff=32, norm_first=True),
        )
    )
    folder = pretrained.export(enc, tok, tmp_path / "enc", layout="auto")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["multihead"]["encoder"]["d_model"] = 10**9
    (folder / "config.json").write_text(json.dumps(cfg))
    csv = tmp_path / "s.csv"
    csv.write_text("text,label\n" + "".join(f"good {i},pos\nbad {i},neg\n" for i in range(20)))
    _refused(["train", "--init", folder, "--data", csv, "--out", tmp_path / "ft"], "config.json")
    assert not (tmp_path / "ft").exists()
