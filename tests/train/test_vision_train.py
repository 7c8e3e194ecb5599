"""``multihead train --data digits``: the ViT run folder end to end, resume, predict, evaluate, refused flags."""

import json

import numpy as np
import pytest

from multihead.cli import main
from train_helpers import assert_resume_matches_straight

SMALL = [
    "--d-model",
    "32",
    "--heads",
    "4",
    "--layers",
    "2",
    "--set",
    "model.encoder.d_ff=64",
    "--set",
    "model.patch_size=2",
    "--set",
    "model.stem=conv",
    "--set",
    "model.stem_channels=16",
    "--batch-size",
    "64",
    "--lr",
    "3e-3",
    "--threads",
    "1",
    "--no-progress",
]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "vit"
    assert main(["train", "--data", "digits", "--out", str(out), "--epochs", "12", *SMALL]) == 0
    return out


def test_a_vit_learns_digits_with_the_baseline_beside_it(digits_run):
    for name in (
        "config.json",
        "labels.json",
        "splits.json",
        "model.safetensors",
        "metrics.jsonl",
        "results.json",
        "confusion.png",
        "curves.png",
        "checkpoint/state.json",
    ):
        assert (digits_run / name).is_file(), name
    r = json.loads((digits_run / "results.json").read_text())
    assert r["test"]["n"] == 179 and r["images"]["train"] == 1439  # 10 % of each class (rounded) held out twice
    assert r["test"]["accuracy"] > 0.8  # chance is 0.1; the pixel baseline is ~0.95 on digits
    assert r["baseline_pixels_logreg"]["accuracy"] > 0.9
    assert r["model"]["tokens"] == 17  # (8 / 2)^2 patches + [CLS]
    evals = [json.loads(x) for x in (digits_run / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["event"] == "eval"]
    assert len(evals) == 12 and evals[-1]["val_accuracy"] > evals[0]["val_accuracy"]


def test_predict_and_evaluate_on_a_vit_run(digits_run, tmp_path, capsys):
    assert main(["predict", str(digits_run), "--index", "0"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["image"] == "test[0]" and row["label"] in [str(i) for i in range(10)] and "true" in row
    img = (np.arange(64).reshape(1, 8, 8) * 4).astype(np.uint8)
    np.save(tmp_path / "x.npy", img)
    assert main(["predict", str(digits_run), "--image", str(tmp_path / "x.npy")]) == 0
    assert json.loads(capsys.readouterr().out)["image"].endswith("x.npy")
    np.save(tmp_path / "big.npy", np.zeros((1, 9, 9), dtype=np.uint8))
    assert main(["predict", str(digits_run), "--image", str(tmp_path / "big.npy")]) == 2
    assert "resize it first" in capsys.readouterr().err
    assert main(["predict", str(digits_run), "--index", "999"]) == 2
    assert "outside the test split" in capsys.readouterr().err
    assert main(["evaluate", str(digits_run), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    results = json.loads((digits_run / "results.json").read_text())
    assert r["accuracy"] == pytest.approx(results["test"]["accuracy"]) and r["n"] == 179


def test_resume_continues_to_the_same_weights(tmp_path, monkeypatch):
    """Two epochs straight == interrupted after the first epoch's checkpoint, then --resume (order and augmentation
    are seeded by epoch and step)."""
    assert_resume_matches_straight(
        tmp_path,
        monkeypatch,
        [
            "--data",
            "digits",
            "--epochs",
            "2",
            "--set",
            "data.limit=256",
            "--set",
            "data.eval_limit=256",
            "--set",
            "run.baseline=false",
            *SMALL,
        ],
    )


def test_text_only_flags_are_refused_by_name(tmp_path, capsys):
    assert main(["train", "--data", "digits", "--out", str(tmp_path / "x"), "--vocab-size", "100"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size" in err and "image classification" in err and not (tmp_path / "x").exists()
    assert main(["train", "--data", "digits", "--out", str(tmp_path / "y"), "--set", "model.patch_size=3"]) == 2
    assert "image_size=8 is not divisible by patch_size=3" in capsys.readouterr().err


def test_show_on_a_vit_run(digits_run, tmp_path, capsys):
    out = tmp_path / "show"
    assert main(["show", str(digits_run), "--index", "3", "--patch", "1,2", "--out", str(out)]) == 0
    for name in ("cls_grid.png", "patch_grid.png", "rollout.png", "distance.png", "image.json", "attention.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "image.json").read_text())
    assert abs(sum(summary["probabilities"].values()) - 1) < 1e-3 and summary["patch"] == [1, 2]
    roll = summary["rollout"]
    assert len(roll) == 4 and abs(sum(map(sum, roll)) - 1) < 1e-4  # a distribution over the 4x4 patches
    dist = summary["mean_attention_distance"]
    assert len(dist) == 2 and all(0 <= v <= 8 * 2**0.5 for layer in dist for v in layer)
    assert "mean attention distance" in capsys.readouterr().out
    assert main(["show", str(digits_run), "--index", "3", "--patch", "9,9", "--out", str(tmp_path / "bad")]) == 2
    assert "outside the 4x4 patch grid" in capsys.readouterr().err
    assert main(["show", str(digits_run), "--out", str(tmp_path / "none")]) == 2
    assert "--index N" in capsys.readouterr().err


def test_importance_and_prune_work_on_a_vit_run_unchanged(digits_run, tmp_path, capsys):
    assert main(["importance", str(digits_run), "--method", "michel", "--out", str(tmp_path / "imp")]) == 0
    payload = json.loads((tmp_path / "imp" / "importance-michel.json").read_text())
    assert payload["n"] == 179 and len(payload["scores"]) == 2 and len(payload["scores"][0]) == 4
    assert "images" in capsys.readouterr().out
    out = tmp_path / "pruned"
    assert (
        main(
            [
                "prune",
                str(digits_run),
                "--out",
                str(out),
                "--step",
                "0.25",
                "--max-drop",
                "0.3",
                "--min-time",
                "0.1",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    r = json.loads((out / "pruning.json").read_text())
    assert r["max_abs_diff_pruned_vs_masked"] < 1e-4  # the pruned model computes what the masked one did
    # the chosen mask keeps validation within --max-drop 0.3; test may differ by a few of its 179 images
    assert r["pruned"] >= 2 and r["test_accuracy_pruned"] >= r["base_test_accuracy"] - 0.35
    assert (out / "pruning.png").is_file() and (out / "model.safetensors").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vision"]["model"]["encoder"]["pruned_heads"] == {str(k): v for k, v in r["pruned_heads"].items()}
    assert main(["evaluate", str(out)]) == 0  # the pruned run loads and evaluates like any other
