"""``--log tensorboard``: every metrics.jsonl event goes to TensorBoard event files in RUN/tensorboard with the same
numbers, the task's pictures go in as images, and a value other than none/tensorboard is refused by name."""

from __future__ import annotations

import json

import pytest

from multihead.cli import main

pytest.importorskip("tensorboard", reason="needs tensorboard: pip install 'multihead[tensorboard]'")

TEXT = [
    "--epochs", "2", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--vocab-size", "100",
    "--max-len", "24", "--text-column", "sentence", "--label-column", "sentiment", "--no-progress", "--threads", "1",
]  # fmt: skip
G2P = [
    "--data", "cmudict", "--limit", "128", "--eval-limit", "32", "--epochs", "1", "--d-model", "32", "--heads", "2",
    "--layers", "1", "--d-ff", "64", "--threads", "1", "--no-progress", "--set", "run.eval_words=8", "--set",
    "run.beam=1", "--set", "data.test_limit=8",
]  # fmt: skip


def _events(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("task", ["text", "g2p"])
def test_tensorboard_holds_the_metrics_and_pictures(tmp_path, sentiment_csv, task):
    run = tmp_path / "run"
    args = ["--data", str(sentiment_csv), *TEXT] if task == "text" else G2P
    assert main(["train", "--out", str(run), "--log", "tensorboard", *args]) == 0
    acc = _events(run)
    tags = acc.Tags()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for kind in ("train", "eval"):
        rows = [e for e in lines if e["event"] == kind]
        assert rows, kind
        for key in {k for e in rows for k in e if isinstance(e[k], float)}:
            logged = {s.step: s.value for s in acc.Scalars(f"{kind}/{key}")}
            expected = {e["step"]: e[key] for e in rows if key in e}
            assert logged.keys() == expected.keys()
            assert all(logged[s] == pytest.approx(v, rel=1e-6, abs=1e-9) for s, v in expected.items())
    assert "train/lr" in tags["scalars"]
    assert sorted(tags["images"]) == sorted(p.stem for p in run.glob("*.png")) and tags["images"]


def test_unknown_tracker_is_refused_by_name(tmp_path, sentiment_csv, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--data", str(sentiment_csv), *TEXT, "--set", "run.log=wandb"]) == 2
    err = capsys.readouterr().err
    assert "run.log" in err and "tensorboard" in err and not run.exists()


def test_missing_tensorboard_is_named_and_nothing_is_written(tmp_path, sentiment_csv, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--data", str(sentiment_csv), *TEXT, "--log", "tensorboard"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'multihead[tensorboard]'" in err and "Traceback" not in err
    assert not run.exists() and not (tmp_path / ".run.new").exists()
