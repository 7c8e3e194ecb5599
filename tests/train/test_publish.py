"""A new run (or an --overwrite) is swapped in only after it has trained and validated: a setting that fails at the
first optimizer step or at validation leaves what was at --out byte-identical, for every task (the run harness does
this once). Before, the new run was published as soon as its step-0 checkpoint existed, so the old run was lost and
--resume failed the same way forever."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from multihead.cli import main

TEXT = [
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
    "--no-progress",
]


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def texts(tmp_path_factory, sentiment_csv):
    from multihead.data import load_texts

    corpus = tmp_path_factory.mktemp("text") / "reviews.txt"
    corpus.write_text("\n".join(load_texts("rotten_tomatoes")[:200]) + "\n")
    return {"csv": Path(sentiment_csv), "corpus": corpus}


def _args(kind: str, texts: dict, out: Path) -> list[str]:
    if kind == "classifier":
        return [
            "train",
            "--data",
            str(texts["csv"]),
            "--text-column",
            "sentence",
            "--label-column",
            "sentiment",
            "--epochs",
            "1",
            "--out",
            str(out),
            *TEXT,
        ]
    if kind == "clm":
        return [
            "pretrain",
            "--objective",
            "clm",
            "--data",
            str(texts["corpus"]),
            "--steps",
            "4",
            "--eval-every",
            "4",
            "--seq-len",
            "32",
            "--batch-size",
            "8",
            "--out",
            str(out),
            *TEXT,
        ]
    return [
        "train",
        "--data",
        "digits",
        "--epochs",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--set",
        "model.encoder.d_ff=32",
        "--set",
        "model.patch_size=4",
        "--set",
        "data.limit=64",
        "--set",
        "data.eval_limit=64",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(out),
        "--set",
        "run.baseline=false",
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, texts):
    made = {}
    for kind in ("classifier", "clm", "vit"):
        out = tmp_path_factory.mktemp("runs") / kind
        assert main(_args(kind, texts, out)) == 0
        made[kind] = out
    return made


@pytest.mark.parametrize("kind", ["classifier", "clm", "vit"])
def test_an_overwrite_that_fails_at_its_first_step_leaves_the_old_run(kind, runs, texts, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs[kind], run)
    before = snapshot(run)
    bad = ["--set", "causal.decoder.backend=window"] if kind == "clm" else ["--set", "model.encoder.backend=window"]
    assert main(_args(kind, texts, run) + ["--overwrite", *bad]) == 2  # the first forward cannot run this backend
    assert "SparsePattern" in capsys.readouterr().err
    assert snapshot(run) == before
    assert not (tmp_path / ".run.new").exists()


@pytest.mark.parametrize("kind", ["classifier", "clm", "vit"])
def test_an_overwrite_that_fails_at_validation_leaves_the_old_run(kind, runs, texts, tmp_path, monkeypatch, capsys):
    from multihead.train import tasks

    run = tmp_path / "run"
    shutil.copytree(runs[kind], run)
    before = snapshot(run)
    task = tasks.KINDS["pretrain" if kind == "clm" else "train" if kind == "classifier" else "vision"].task_class()

    def broken(self, model):
        raise RuntimeError("validation failed")

    monkeypatch.setattr(task, "validate", broken)
    assert main(_args(kind, texts, run) + ["--overwrite"]) == 70  # reported as an internal error, nothing published
    assert snapshot(run) == before and not (tmp_path / ".run.new").exists()
    monkeypatch.undo()
    assert main(_args(kind, texts, run) + ["--overwrite"]) == 0  # the same command, working: the new run lands
    assert snapshot(run) != before and (run / "results.json").is_file()
