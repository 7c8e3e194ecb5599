"""Shared by the image-task training tests: an interrupted run, resumed, ends where a straight one does."""

import json

import torch
from safetensors.torch import load_file

from multihead.cli import main


def assert_resume_matches_straight(tmp_path, monkeypatch, common: list[str]) -> None:
    """Train ``common`` straight; train it again but die right after epoch 1's checkpoint (as a kill would), then
    ``--resume``: the final weights and test results are identical (order and randomness are seeded by epoch and
    step)."""
    from multihead.train.harness import Loop

    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["train", "--out", str(full), *common]) == 0

    class Killed(Exception):
        pass

    original = Loop.run_epoch

    def end_then_die(self, epoch):
        original(self, epoch)
        raise Killed  # after epoch 1's checkpoint

    monkeypatch.setattr(Loop, "run_epoch", end_then_die)
    assert main(["train", "--out", str(part), *common]) != 0  # reported as a failure, the folder left resumable
    monkeypatch.setattr(Loop, "run_epoch", original)
    assert main(["train", "--out", str(part), "--resume", "--no-progress"]) == 0

    def weights(run):
        state = json.loads((run / "checkpoint" / "state.json").read_text())
        return load_file(str(run / "checkpoint" / state["file"]))

    a, b = weights(full), weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith("model."))
    assert (
        json.loads((part / "results.json").read_text())["test"]
        == json.loads((full / "results.json").read_text())["test"]
    )
