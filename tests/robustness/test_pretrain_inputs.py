"""Hostile input to the pretraining, generation, induction and sinks commands: a message that names the fix, exit 2,
no traceback, and nothing written or changed on disk."""

import pytest

from multihead.cli import main

TINY = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--d-ff",
    "32",
    "--seq-len",
    "16",
    "--vocab-size",
    "100",
    "--threads",
    "1",
    "--no-progress",
]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(f"a short line of text number {i}\n" for i in range(30)))
    return path


def _refused(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--objective", "gpt"], "objective.name must be one of"),
        (["--seq-len", "4"], "data.seq_len must be in"),
        (["--vocab-size", "3"], "data.vocab_size must be in"),
        (["--batch-size", "0"], "optim.batch_size must be >= 1"),
        (["--lr", "-1"], "optim.lr must be > 0"),
        (["--set", "objective.random_replace=0.5"], "objective.random_replace must be in"),
        (["--set", "run.eval_rows=0"], "run.eval_rows must be >= 1"),
        (["--set", "data.validation=0.9"], "data.validation must be in"),
        (["--resume", "--overwrite"], "pass one of them"),
    ],
)
def test_pretrain_config_is_checked_before_any_work(tmp_path, capsys, text, args, message):
    out = tmp_path / "run"
    _refused(capsys, ["pretrain", "--data", str(text), "--out", str(out), *TINY, *args], message)
    assert not out.exists()


def test_pretrain_does_not_replace_a_run_or_someone_elses_folder(tmp_path, capsys, text):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _refused(capsys, ["pretrain", "--data", str(text), "--out", str(mine), *TINY], "--overwrite")
    assert (mine / "notes.txt").read_text() == "keep" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_pretrain_data_too_small_for_one_row(tmp_path, capsys):
    few = tmp_path / "few.txt"
    few.write_text("one\ntwo\n")
    _refused(
        capsys,
        ["pretrain", "--data", str(few), "--out", str(tmp_path / "r"), *TINY, "--seq-len", "64"],
        "fewer than one row",
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "RUN", "x", "--max-new", "0"], "a positive integer"),
        (["generate", "RUN", "x", "--top-k", "-1"], "an integer >= 0"),
        (["sinks", "RUN", "--window", "0"], "a positive integer"),
        (["sinks", "RUN", "--texts", "0"], "a positive integer"),
        (["sinks", "RUN", "--sinks", "-2"], "an integer >= 0"),
        (["induction", "--out", "OUT", "--steps", "0"], "a positive integer"),
        (["induction", "--out", "OUT", "--half", "1"], "half must be >= 2"),
        (["induction", "--out", "OUT", "--heads", "3"], "d_model must be a positive multiple of num_heads"),
    ],
)
def test_generation_sinks_induction_flags(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in argv]
    with pytest.raises(SystemExit) if message.startswith(("a positive", "an integer")) else _no_exit():
        assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "OUT").exists()


def test_generate_and_sinks_on_folders_that_are_not_causal_runs(tmp_path, capsys):
    _refused(capsys, ["generate", str(tmp_path), "hello"], "not a pretraining run folder")
    _refused(capsys, ["sinks", str(tmp_path)], "not a pretraining run folder")
    assert list(tmp_path.iterdir()) == []


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
