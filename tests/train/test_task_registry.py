"""The task registry: every command asks one function what a run folder is, and every verb either works on a run of
each task kind or refuses with the reason and the command that does (exit 2, no traceback)."""

import json

import pytest

from multihead.cli import main
from multihead.train import tasks

TINY = ["--threads", "1", "--no-progress"]
RUNS = {
    "train": [
        "train",
        "--data",
        "SENTIMENT",
        "--text-column",
        "sentence",
        "--label-column",
        "sentiment",
        "--epochs",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--d-ff",
        "32",
        "--max-len",
        "24",
        "--vocab-size",
        "120",
        *TINY,
    ],
    "g2p": [
        "train",
        "--data",
        "cmudict",
        "--limit",
        "120",
        "--eval-limit",
        "120",
        "--epochs",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--d-ff",
        "32",
        "--set",
        "run.eval_words=10",
        "--set",
        "data.test_limit=10",
        "--set",
        "run.beam=1",
        *TINY,
    ],
    "vision": [
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
        "data.limit=256",
        "--set",
        "data.eval_limit=256",
        "--set",
        "run.baseline=false",
        *TINY,
    ],
    "grounding": [
        "train",
        "--data",
        "digits_qa",
        "--epochs",
        "1",
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
        "data.canvases=128",
        "--set",
        "data.validation=32",
        "--set",
        "data.test=48",
        "--batch-size",
        "64",
        *TINY,
    ],
    "pretrain": [
        "pretrain",
        "--objective",
        "clm",
        "--data",
        "rotten_tomatoes",
        "--limit",
        "150",
        "--steps",
        "4",
        "--eval-every",
        "4",
        "--seq-len",
        "32",
        "--vocab-size",
        "200",
        "--batch-size",
        "8",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--d-ff",
        "32",
        *TINY,
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sentiment_csv):
    root = tmp_path_factory.mktemp("kinds")
    out = {}
    for section, argv in RUNS.items():
        argv = [str(sentiment_csv) if a == "SENTIMENT" else a for a in argv]
        assert main([*argv, "--out", str(root / section)]) == 0, section
        out[section] = root / section
    return out


def test_one_function_says_what_a_folder_is(runs, tmp_path):
    assert {s: tasks.kind_of(p).section for s, p in runs.items()} == {s: s for s in runs}
    assert tasks.kind_of(tmp_path) is None and tasks.kind_of(tmp_path / "missing") is None
    assert tasks.for_data("cmudict").section == "g2p" and tasks.for_data("digits").section == "vision"
    assert tasks.for_data("digits_qa").section == "grounding" and tasks.for_data("imdb").section == "train"


# (verb, kind) -> argv after the run folder; None: the verb refuses this kind (exit 2, the reason names a command)
WORKS = {
    ("evaluate", "train"): [],
    ("evaluate", "g2p"): [],
    ("evaluate", "vision"): [],
    ("evaluate", "grounding"): [],
    ("evaluate", "pretrain"): [],
    ("predict", "train"): ["a fine film"],
    ("predict", "g2p"): ["attention"],
    ("predict", "vision"): ["--index", "3"],
    ("predict", "grounding"): None,
    ("predict", "pretrain"): None,
    ("show", "train"): ["a fine film", "--out", "OUT"],
    ("show", "g2p"): ["attention", "--out", "OUT"],
    ("show", "vision"): ["--index", "3", "--out", "OUT"],
    ("show", "grounding"): ["--index", "2", "--out", "OUT"],
    ("show", "pretrain"): None,
    ("heads", "train"): ["--data", "SENTIMENT", "--text-column", "sentence", "--label-column", "sentiment", "--n", "8"],
    ("heads", "g2p"): None,
    ("heads", "vision"): None,
    ("heads", "grounding"): None,
    ("heads", "pretrain"): ["--data", "rotten_tomatoes", "--n", "4"],
    ("generate", "train"): None,
    ("generate", "g2p"): None,
    ("generate", "vision"): None,
    ("generate", "grounding"): None,
    ("generate", "pretrain"): ["The film", "--max-new", "4"],
    ("sinks", "train"): None,
    ("sinks", "vision"): None,
}


@pytest.mark.parametrize("verb, kind", sorted(WORKS))
def test_every_verb_on_every_kind_works_or_refuses_with_the_reason(verb, kind, runs, tmp_path, capsys, sentiment_csv):
    extra = WORKS[(verb, kind)]
    argv = [verb, str(runs[kind])]
    if extra is not None:
        argv += [str(tmp_path / "out") if a == "OUT" else str(sentiment_csv) if a == "SENTIMENT" else a for a in extra]
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if extra is None:
        assert code == 2 and f"{verb} does not apply to" in err and "multihead " in err, err
    else:
        assert code == 0, err
        assert out.strip()


def test_evaluate_prints_the_grounding_scores_and_the_language_model_perplexity(runs, capsys):
    assert main(["evaluate", str(runs["grounding"]), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["by_kind"]) == {"where", "what"} and 0 <= r["accuracy"] <= 1 and r["n"] == 48
    assert main(["evaluate", str(runs["pretrain"]), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["objective"] == "clm" and r["tokens"] > 0 and r["perplexity"] > 1


def test_a_folder_that_is_no_run_is_named_as_such(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "is not a multihead run folder" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "missing"), "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_folder_kinds_and_the_registry_name_the_same_sections():
    """_io.folder_kind (the ground floor, which cannot import train) lists the run sections itself: kept in step."""
    from multihead._io import RUN_SECTIONS

    assert set(RUN_SECTIONS) == set(tasks.KINDS)


def test_evaluate_refuses_a_split_a_grounding_run_does_not_have(runs, capsys):
    before = {p: p.read_bytes() for p in runs["grounding"].rglob("*") if p.is_file()}
    assert main(["evaluate", str(runs["grounding"]), "--split", "validation"]) == 2
    err = capsys.readouterr().err
    assert "held-out test canvases; drop --split validation" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in runs["grounding"].rglob("*") if p.is_file()} == before


def test_a_dataset_typo_suggests_the_closest_built_in_and_is_never_read_as_a_path(tmp_path, capsys, monkeypatch):
    from multihead.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", "digit", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'digit'; did you mean digits" in err and str(tmp_path) not in err
    for name in ("rotten_tomatoes", "cmudict", "fashion_mnist", "digits_qa"):  # every task's built-ins are listed
        assert name in err
    assert not (tmp_path / "run").exists()
