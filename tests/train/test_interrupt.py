"""Ctrl-C during training: the step under way finishes, its checkpoint is saved, the message says how to continue,
and ``--resume`` ends at the same weights as a run that was never interrupted. The signal is a real SIGINT sent to
this process in the middle of a step."""

from __future__ import annotations

import json
import os
import signal

from safetensors.torch import load_file

from multihead.cli import main

G2P = [
    "--data",
    "cmudict",
    "--limit",
    "256",
    "--eval-limit",
    "64",
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--layers",
    "1",
    "--d-ff",
    "64",
    "--threads",
    "1",
    "--no-progress",
    "--set",
    "run.eval_words=16",
    "--set",
    "run.beam=1",
    "--set",
    "data.test_limit=16",
]


def _weights(run):
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    return state, load_file(str(run / "checkpoint" / state["file"]))


def _interrupt_at(monkeypatch, step: int) -> None:
    """Send SIGINT to this process while optimizer step ``step`` (1-based) runs."""
    from multihead.train.harness import Loop

    original = Loop.step

    def step_with_signal(self, batch, epoch):
        if self.position["step"] + 1 == step:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, batch, epoch)

    monkeypatch.setattr(Loop, "step", step_with_signal)


def test_ctrl_c_saves_the_step_and_resume_matches_a_straight_run(tmp_path, monkeypatch, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    before = signal.getsignal(signal.SIGINT)  # the default, or SIG_IGN where the suite runs in the background
    assert main(["train", "--out", str(full), *G2P]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        _interrupt_at(m, 3)  # mid-epoch 1, before the first validation: a new run is published to be resumable
        assert main(["train", "--out", str(part), *G2P]) == 130
    err = capsys.readouterr().err
    assert "interrupted at step 3 (epoch 1, batch 3)" in err and "--resume" in err, err
    state, _ = _weights(part)
    assert state["step"] == 3 and not (part / "results.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # the handler is only there while training
    assert main(["train", "--out", str(part), "--resume", "--no-progress"]) == 0
    (_, a), (_, b) = _weights(full), _weights(part)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a if k.startswith("model."))
    res = [json.loads((r / "results.json").read_text()) for r in (full, part)]
    assert res[0]["test_greedy"] == res[1]["test_greedy"]


def test_ctrl_c_before_validation_leaves_the_run_it_would_replace(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *G2P]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    capsys.readouterr()
    with monkeypatch.context() as m:
        _interrupt_at(m, 2)
        assert main(["train", "--out", str(out), "--overwrite", *G2P]) == 130
    err = capsys.readouterr().err
    assert f"the run at {out} is unchanged" in err, err
    after = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before
    assert not (tmp_path / ".run.new").exists()  # no staged folder left behind
