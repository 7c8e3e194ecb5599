"""Every writer, failing at a random point: a full disk at the N-th file written (N drawn by hypothesis) during train,
pretrain, G2P, ViT, grounding, compare, prune, export or show with --overwrite leaves the target byte-identical to
before, or holding the complete new output, or (a failure after a new run was published, i.e. after it trained and
validated) a run that --resume completes; no input file is ever touched."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from multihead.cli import main

SMALL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--threads", "1", "--no-progress"]


def _commands(inputs: dict, out: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, the file a complete output holds)."""
    text = ["--vocab-size", "300", "--d-ff", "32", *SMALL]
    return {
        "train": (
            [
                "train",
                "--data",
                inputs["csv"],
                "--text-column",
                "sentence",
                "--label-column",
                "sentiment",
                "--epochs",
                "1",
                "--out",
                out,
                *text,
            ],
            "results.json",
        ),
        "pretrain": (
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                inputs["corpus"],
                "--steps",
                "3",
                "--eval-every",
                "3",
                "--seq-len",
                "32",
                "--batch-size",
                "8",
                "--out",
                out,
                *text,
            ],
            "results.json",
        ),
        "g2p": (
            [
                "train",
                "--data",
                "cmudict",
                "--limit",
                "200",
                "--eval-limit",
                "200",
                "--epochs",
                "1",
                "--batch-size",
                "64",
                "--d-ff",
                "32",
                "--set",
                "run.eval_words=10",
                "--set",
                "data.test_limit=10",
                "--set",
                "run.beam=1",
                "--out",
                out,
                *SMALL,
            ],
            "results.json",
        ),
        "vision": (
            [
                "train",
                "--data",
                "digits",
                "--epochs",
                "1",
                "--set",
                "model.encoder.d_ff=32",
                "--set",
                "model.patch_size=4",
                "--set",
                "data.limit=64",
                "--set",
                "data.eval_limit=64",
                "--set",
                "run.baseline=false",
                "--out",
                out,
                *SMALL,
            ],
            "results.json",
        ),
        "grounding": (
            [
                "train",
                "--data",
                "digits_qa",
                "--epochs",
                "1",
                "--set",
                "model.text.d_ff=32",
                "--set",
                "model.vision.encoder.d_model=16",
                "--set",
                "model.vision.encoder.num_layers=1",
                "--set",
                "data.canvases=64",
                "--set",
                "data.validation=16",
                "--set",
                "data.test=16",
                "--out",
                out,
                *SMALL,
            ],
            "results.json",
        ),
        "compare": (
            [
                "compare",
                "--data",
                inputs["corpus"],
                "--variants",
                "mha",
                "--seeds",
                "1",
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--seq-len",
                "24",
                "--d-model",
                "16",
                "--heads",
                "2",
                "--layers",
                "1",
                "--d-ff",
                "32",
                "--vocab-size",
                "300",
                "--threads",
                "1",
                "--out",
                out,
            ],
            "compare.json",
        ),
        "prune": (["prune", inputs["run"], "--out", out, "--min-time", "0", "--threads", "1"], "pruning.json"),
        "export": (["export", "minilm", "--out", out], "model.safetensors"),  # a BERT-layout model
        "show": (["show", inputs["run"], "a good film", "--out", out], "attention.html"),
    }


def _digest(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, sentiment_csv):
    from multihead.data import load_texts

    root = tmp_path_factory.mktemp("inputs")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(load_texts("rotten_tomatoes")[:200]) + "\n")
    run = root / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(sentiment_csv),
                "--text-column",
                "sentence",
                "--label-column",
                "sentiment",
                "--epochs",
                "1",
                "--out",
                str(run),
                "--vocab-size",
                "300",
                "--d-ff",
                "32",
                *SMALL,
            ]
        )
        == 0
    )
    return {"csv": str(sentiment_csv), "corpus": str(corpus), "run": str(run)}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, inputs):
    """One finished output of every command: the 'before' that a failed --overwrite must leave as it was."""
    root = tmp_path_factory.mktemp("outputs")
    made = {}
    for name, (argv, marker) in _commands(inputs, root / "NAME").items():
        out = root / name
        assert main([str(out) if a == root / "NAME" else str(a) for a in argv]) == 0, name
        assert (out / marker).is_file(), name
        made[name] = out
    return made


@pytest.mark.parametrize(
    "name", ["train", "pretrain", "g2p", "vision", "grounding", "compare", "prune", "export", "show"]
)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fail_at=st.integers(min_value=1, max_value=40))
def test_a_write_failing_anywhere_leaves_the_old_output_or_the_new_one(name, fail_at, inputs, outputs, monkeypatch):
    out = outputs[name]
    argv, marker = _commands(inputs, out)[name]
    before, sources = _digest(out), {k: _digest(Path(v).parent) for k, v in inputs.items()}
    calls = {"n": 0}
    real = os.fsync

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code = main([str(a) for a in argv] + ["--overwrite"])
    monkeypatch.setattr(os, "fsync", real)
    if code != 0:
        assert code == 2, (name, fail_at, code)
        if _digest(out) != before and not (out / marker).is_file():
            # published, then a later write failed: the run is resumable and a resume completes it
            assert argv[0] in ("train", "pretrain") and (out / "checkpoint" / "state.json").is_file(), (name, fail_at)
            assert main([argv[0], "--out", str(out), "--resume", "--no-progress"]) == 0
    assert (out / marker).is_file()
    assert {k: _digest(Path(v).parent) for k, v in inputs.items()} == sources  # inputs never touched
    assert not list(out.parent.glob(f".{out.name}.new*"))  # no half-built folder left behind
