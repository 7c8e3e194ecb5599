"""``multihead train --data digits_qa``: the grounding run folder end to end, resume, show, refused flags."""

import json

import pytest
import torch

from multihead.cli import main
from train_helpers import assert_resume_matches_straight

SMALL = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--set",
    "model.text.d_ff=32",
    "--set",
    "model.vision.encoder.d_model=24",
    "--set",
    "model.vision.encoder.num_layers=1",
    "--set",
    "data.canvases=512",
    "--set",
    "data.validation=64",
    "--set",
    "data.test=200",
    "--batch-size",
    "64",
    "--threads",
    "1",
    "--no-progress",
]


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "qa"
    assert main(["train", "--data", "digits_qa", "--out", str(out), "--epochs", "2", *SMALL]) == 0
    return out


def test_a_grounding_run_folder_reports_accuracy_the_cut_and_the_share(qa_run):
    for name in (
        "config.json",
        "labels.json",
        "model.safetensors",
        "metrics.jsonl",
        "results.json",
        "curves.png",
        "grounding.png",
        "checkpoint/state.json",
    ):
        assert (qa_run / name).is_file(), name
    r = json.loads((qa_run / "results.json").read_text())
    assert r["answers"][:4] == ["top left", "top right", "bottom left", "bottom right"] and len(r["answers"]) == 14
    assert r["test"]["n"] == 200 and r["canvases"]["patches"] == 16  # 16x16 canvases, patch 4
    for part in ("test", "cross_heads_masked"):
        assert all(0 <= r[part][k] <= 1 for k in ("accuracy", "where", "what"))
    share = torch.tensor(r["test"]["grounding_share"])
    assert share.shape == (1, 2) and ((share >= 0) & (share <= 1)).all()
    assert r["test"]["grounding_best"]["share"] == pytest.approx(share.max().item())
    assert r["test"]["grounding_mean"] == pytest.approx(share.mean().item())
    assert r["chance"] == {"where": 0.25, "what": 0.1, "grounding_share": 0.25}
    config = json.loads((qa_run / "config.json").read_text())["grounding"]
    assert config["model"]["text"]["memory_dim"] == 24 and config["model"]["vision"]["image_size"] == 16


def test_show_draws_the_question_over_the_canvas(qa_run, tmp_path, capsys):
    out = tmp_path / "show"
    assert main(["show", str(qa_run), "--index", "5", "--out", str(out)]) == 0
    for name in ("cross_grid.png", "words.png", "canvas.json", "attention.html"):
        assert (out / name).is_file(), name
    s = json.loads((out / "canvas.json").read_text())
    assert s["true"] in json.loads((qa_run / "labels.json").read_text())
    share = torch.tensor(s["share_by_quadrant"])  # (layers, heads, quadrants): the question's mass sums to 1
    torch.testing.assert_close(share.sum(-1), torch.ones(share.shape[:2]), atol=1e-4, rtol=0)
    assert (
        main(
            [
                "show",
                str(qa_run),
                "--index",
                "5",
                "--question",
                "what is at the top left?",
                "--out",
                str(tmp_path / "asked"),
            ]
        )
        == 0
    )
    assert "what is at the top left ?" in capsys.readouterr().out
    assert (
        main(["show", str(qa_run), "--index", "5", "--question", "where is the cat?", "--out", str(tmp_path / "bad")])
        == 2
    )
    assert "CLASS one of: 0, 1" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["show", str(qa_run), "--index", "9999", "--out", str(tmp_path / "far")]) == 2
    assert "outside the test canvases" in capsys.readouterr().err


def test_resume_continues_to_the_same_weights(tmp_path, monkeypatch):
    """Fresh canvases every step, seeded by the step: an interrupted run resumed ends where a straight one does."""
    assert_resume_matches_straight(tmp_path, monkeypatch, ["--data", "digits_qa", "--epochs", "2", *SMALL])


def test_flags_that_do_not_apply_are_refused_by_name(tmp_path, capsys):
    assert main(["train", "--data", "digits_qa", "--out", str(tmp_path / "x"), "--vocab-size", "100"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size" in err and "grounding" in err and not (tmp_path / "x").exists()
    assert (
        main(["train", "--data", "digits_qa", "--out", str(tmp_path / "y"), "--set", "model.vision.patch_size=3"]) == 2
    )
    assert "not divisible by patch_size=3" in capsys.readouterr().err
