"""Run folders are never lost or mixed: transactions, locks, refusals (defects 1-4 of the reliability issue, and the
resume/interrupt cases). Every test runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from robust_helpers import refused, run_cli, snapshot, tiny_train_args

from multihead._io import write_manifest

from multihead._io import folder_kind


def _spawn(*args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "multihead.cli", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_when(proc: subprocess.Popen, condition, timeout: float = 300) -> bool:
    """SIGKILL ``proc`` as soon as ``condition()`` holds; False if it ended first."""
    end = time.time() + timeout
    while time.time() < end:
        if condition():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("condition never held")


def _is_complete_run(folder: Path) -> bool:
    names = {"config.json", "tokenizer.json", "labels.json", "splits.json"}
    return (
        folder_kind(folder) == "run"
        and names <= {p.name for p in folder.iterdir()}
        and (folder / "checkpoint" / "state.json").is_file()
    )


# ---------------------------------------------------------------------------------------------------- 1. overwrite
def test_overwrite_with_a_bad_value_leaves_the_old_run_intact(run_copy, data_csv):
    before = snapshot(run_copy)
    proc = run_cli(*tiny_train_args(data_csv, run_copy, "--overwrite", "--set", "optim.lr=abc"), subprocess_=True)
    refused(proc, "optim.lr", "valid number", "'abc'")
    assert snapshot(run_copy) == before


def test_overwrite_that_fails_on_its_data_leaves_the_old_run_intact(run_copy, tmp_path):
    before = snapshot(run_copy)
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,sentiment\ngood film,\n")
    proc = run_cli(*tiny_train_args(bad, run_copy, "--overwrite"))
    refused(proc, "bad.csv:2", "empty")
    assert snapshot(run_copy) == before
    assert not any(p.name.startswith(".run.new") for p in run_copy.parent.iterdir())


@pytest.mark.parametrize("point", ["staging", "first-checkpoint", "after-swap"])
def test_sigkill_during_overwrite_leaves_old_run_or_complete_new_one(run_copy, data_csv, point):
    before = snapshot(run_copy)
    staged = run_copy.parent / ".run.new"
    conditions = {
        "staging": lambda: staged.is_dir(),
        "first-checkpoint": lambda: (staged / "checkpoint").is_dir(),
        "after-swap": lambda: (run_copy / "checkpoint").is_dir() and not (run_copy / "results.json").exists(),
    }
    proc = _spawn(*tiny_train_args(data_csv, run_copy, "--overwrite", "--epochs", "3", "--save-every", "5"))
    killed = _kill_when(proc, conditions[point])
    assert killed, "the run finished before the kill point"
    if snapshot(run_copy) != before:
        assert _is_complete_run(run_copy), sorted(p.name for p in run_copy.iterdir())
        proc = run_cli(*tiny_train_args(data_csv, run_copy, "--epochs", "3", "--save-every", "5", "--resume"))
        assert proc.returncode == 0, proc.stderr
        assert (run_copy / "results.json").is_file()
    else:
        # the old run is whole; the next writer cleans the half-built folder and the run can be replaced
        proc = run_cli(*tiny_train_args(data_csv, run_copy, "--overwrite"))
        assert proc.returncode == 0, proc.stderr
    assert not staged.exists()


def test_a_resumed_run_refuses_changed_flags(run_copy, data_csv):
    before = snapshot(run_copy)
    proc = run_cli(*tiny_train_args(data_csv, run_copy, "--resume", "--lr", "0.5"))
    refused(proc, "optim.lr=0.5", "recorded")
    assert snapshot(run_copy) == before


def test_resume_and_overwrite_together_are_refused(run_copy, data_csv):
    refused(run_cli(*tiny_train_args(data_csv, run_copy, "--resume", "--overwrite")), "one of them")


def test_an_interrupted_run_gives_one_consistent_advice(tmp_path, data_csv):
    """A new run appears at --out only once it has trained and validated (then it holds its best model and a
    checkpoint, and --resume continues it); killed before that, nothing is published and a plain retry starts."""
    out, staged = tmp_path / "run", tmp_path / ".run.new"
    proc = _spawn(*tiny_train_args(data_csv, out, "--epochs", "3"))
    assert _kill_when(proc, lambda: (staged / "checkpoint" / "state.json").is_file())
    assert not out.exists()
    refused(run_cli("predict", out, "good film"), "does not exist")
    refused(run_cli(*tiny_train_args(data_csv, out, "--epochs", "3", "--resume")), "nothing to resume")
    proc = run_cli(*tiny_train_args(data_csv, out, "--epochs", "3"))
    assert proc.returncode == 0, proc.stderr
    assert run_cli("predict", out, "good film").returncode == 0 and not staged.exists()


def test_the_thread_count_is_recorded_for_resume(trained_run):
    config = json.loads((trained_run / "config.json").read_text())
    assert config["train"]["run"]["threads"] == 1  # recorded, so a resume uses the same reduction order


def test_epochs_zero_is_refused_before_anything(tmp_path, data_csv):
    out = tmp_path / "run"
    refused(run_cli(*tiny_train_args(data_csv, out, "--epochs", "0")), "optim.epochs", "[1,")
    assert not out.exists()


def test_user_data_is_recorded_by_absolute_path(trained_run, data_csv, tmp_path):
    assert json.loads((trained_run / "config.json").read_text())["train"]["data"]["name"] == str(data_csv.resolve())
    proc = run_cli("evaluate", trained_run, cwd=tmp_path)  # from another directory
    assert proc.returncode == 0, proc.stderr
    assert "accuracy" in proc.stdout


# ---------------------------------------------------------------------------------------------------- 2. export
def test_export_onto_its_own_run_is_refused(run_copy):
    before = snapshot(run_copy)
    refused(run_cli("export", run_copy, "--out", run_copy), "folder being read")
    assert snapshot(run_copy) == before
    assert run_cli("predict", run_copy, "good").returncode == 0


def test_export_onto_another_run_needs_overwrite(run_copy, trained_run, tmp_path):
    other = tmp_path / "other"
    import shutil

    shutil.copytree(trained_run, other)
    before = snapshot(other)
    refused(run_cli("export", run_copy, "--out", other), "training run", "--overwrite")
    assert snapshot(other) == before


def test_sigkill_during_export_leaves_nothing_half_written(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "bert", "old": true}')
    write_manifest(out)  # an earlier export: multihead's own files, which --overwrite may replace
    before = snapshot(out)
    proc = _spawn("export", "minilm", "--out", out, "--overwrite")
    staged = tmp_path / ".hf.new"
    if _kill_when(proc, lambda: staged.is_dir(), timeout=120):
        assert snapshot(out) == before or {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    proc = run_cli("export", "minilm", "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text()).get("old") is None
    assert not staged.exists()


# ---------------------------------------------------------------------------------------------------- 3. prune
def test_prune_onto_an_existing_run_needs_overwrite(run_copy, trained_run):
    before = snapshot(run_copy)
    refused(run_cli("prune", trained_run, "--out", run_copy, "--min-time", "0"), "training run", "--overwrite")
    assert snapshot(run_copy) == before


def test_prune_onto_its_source_is_refused(run_copy):
    before = snapshot(run_copy)
    refused(run_cli("prune", run_copy, "--out", run_copy, "--min-time", "0", "--overwrite"), "folder being read")
    assert snapshot(run_copy) == before


def test_sigkill_during_prune_leaves_the_target_intact(run_copy, trained_run, tmp_path):
    before = snapshot(run_copy)
    staged = run_copy.parent / ".run.new"
    proc = _spawn("prune", trained_run, "--out", run_copy, "--overwrite", "--min-time", "5")
    if _kill_when(proc, lambda: (staged / "model.safetensors").is_file(), timeout=300):
        assert snapshot(run_copy) == before
    proc = run_cli("prune", trained_run, "--out", run_copy, "--overwrite", "--min-time", "0")
    assert proc.returncode == 0, proc.stderr
    assert (run_copy / "pruning.json").is_file() and not (run_copy / "results.json").exists()
    assert not staged.exists()


# ---------------------------------------------------------------------------------------------------- 4. lock
def test_two_writers_on_one_folder_the_second_is_refused_with_the_pid(tmp_path, data_csv):
    out = tmp_path / "run"
    first = _spawn(*tiny_train_args(data_csv, out, "--epochs", "20", "--patience", "0"))
    lock = tmp_path / ".run.lock"
    try:
        end = time.time() + 120
        while not (lock.exists() and lock.read_text().strip()) and time.time() < end:
            time.sleep(0.01)
        second = run_cli(*tiny_train_args(data_csv, out, "--overwrite"))
        refused(second, "another multihead process", f"pid {first.pid}")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
