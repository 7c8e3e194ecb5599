"""Grapheme-to-phoneme on CMUdict: the data (kept words, split by word, scores), and the CLI end to end on a small
model: train, predict, evaluate (greedy and beam), show (three kinds of attention, monotonicity), resume, bad input."""

from __future__ import annotations

import json

import pytest

from multihead.cli import main
from multihead.data import g2p as G

SMALL = [
    "--limit",
    "300",
    "--eval-limit",
    "300",
    "--epochs",
    "1",
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
    "run.eval_words=40",
    "--set",
    "run.beam=2",
]


@pytest.fixture(scope="module")
def lexicon():
    return G.load_cmudict()


def test_cmudict_words_pronunciations_and_a_split_by_word(lexicon):
    assert len(lexicon) > 120_000 and lexicon.stats["pronunciations"] > len(lexicon)
    i = lexicon.words.index("read")
    assert {" ".join(p) for p in lexicon.prons[i]} >= {"R EH1 D", "R IY1 D"}  # alternatives kept together
    assert all(G.WORD.match(w) for w in lexicon.words[:5000])
    rec = G.split_words(lexicon, seed=3)
    parts = [set(rec[k]) for k in ("train", "validation", "test")]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])  # a word is in one split only
    assert sum(map(len, parts)) == len(lexicon) and abs(len(parts[2]) - 0.05 * len(lexicon)) < 2
    assert G.split_words(lexicon, seed=3) == rec and G.split_words(lexicon, seed=4)["test"] != rec["test"]
    changed = G.Lexicon(lexicon.words[:-1], lexicon.prons[:-1])
    with pytest.raises(G.DataError, match="differs from the one this run was split on"):
        G.apply_split(changed, rec)


def test_word_and_phoneme_error_rates_by_hand():
    refs = [[("K", "AE1", "T")], [("R", "EH1", "D"), ("R", "IY1", "D")], [("D", "AO1", "G")]]
    preds = [["K", "AE1", "T"], ["R", "IY1", "D"], ["D", "AO1"]]  # right, right (second reference), one deletion
    s = G.score(preds, refs)
    assert s["wer"] == pytest.approx(1 / 3) and s["per"] == pytest.approx(1 / 9)
    assert G.edit_distance("kitten", "sitting") == 3 and G.edit_distance([], [1, 2]) == 2
    # without stress: "K AE0 T" for "K AE1 T" is right, 3 words, 1 deletion over 9 phones as before
    s = G.score([["K", "AE0", "T"], ["R", "IY2", "D"], ["D", "AO1"]], refs)
    assert s["wer"] == pytest.approx(1.0) and s["per"] == pytest.approx(3 / 9)
    assert s["wer_no_stress"] == pytest.approx(1 / 3) and s["per_no_stress"] == pytest.approx(1 / 9)
    assert G.no_stress(("AH0", "T", "EH1", "N")) == ("AH", "T", "EH", "N")


@pytest.mark.parametrize(
    "word,match",
    [
        ("", "empty word"),
        ("42", "digits"),
        ("naïve", "letters outside a-z"),
        ("a-b", "symbols"),
        ("x" * 41, "up to 40 letters"),
    ],
)
def test_unsupported_words_say_what_is_supported(word, match):
    with pytest.raises(G.DataError, match=match):
        G.check_word(word)
    assert G.check_word(" O'Clock ") == "o'clock"


@pytest.fixture(scope="module")
def g2p_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("g2p") / "run"
    assert main(["train", "--data", "cmudict", "--out", str(out), *SMALL]) == 0
    return out


def test_train_writes_a_run_folder_with_greedy_and_beam_results(g2p_run):
    names = {p.name for p in g2p_run.iterdir()}
    assert {
        "config.json",
        "vocab.json",
        "splits.json",
        "model.safetensors",
        "metrics.jsonl",
        "results.json",
        "curve.png",
        "curve.svg",
        "checkpoint",
    } <= names
    r = json.loads((g2p_run / "results.json").read_text())
    for key in ("test_greedy", "test_beam"):
        assert r[key]["words"] == 300 and 0 <= r[key]["wer"] <= 1 and r[key]["per"] >= 0  # PER counts insertions
    assert r["test_beam"]["beam"] == 2 and r["words"]["train"] == 300
    cfg = json.loads((g2p_run / "config.json").read_text())["g2p"]
    assert cfg["model"]["encoder"]["d_model"] == cfg["model"]["decoder"]["d_model"] == 32
    evals = [json.loads(x) for x in (g2p_run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert len(evals) == 1 and {"val_wer", "val_per", "minutes"} <= set(evals[0])


def test_predict_evaluate_and_show(g2p_run, tmp_path, capsys):
    assert main(["predict", str(g2p_run), "attention", "Multihead", "--beam", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [x.split("\t")[0] for x in lines] == ["attention", "multihead"]
    assert main(["evaluate", str(g2p_run), "--split", "validation", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["split"] == "validation" and r["beam"] == 1 and 0 <= r["wer"] <= 1
    out = tmp_path / "photo"
    assert main(["show", str(g2p_run), "photograph", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "cross.html",
        "encoder.html",
        "decoder.html",
        "cross_grid.png",
        "alignment.png",
        "monotonicity.png",
        "summary.json",
    } <= names
    s = json.loads((out / "summary.json").read_text())
    scores = s["monotonicity"]["per_head"]
    assert len(scores) == 1 and len(scores[0]) == 2 and all(0 <= v <= 1 for v in scores[0])
    assert s["letters"] == list("photograph") + ["<eos>"]


def test_resume_a_finished_run_gives_the_same_results(g2p_run):
    before = json.loads((g2p_run / "results.json").read_text())
    assert main(["train", "--data", "cmudict", "--out", str(g2p_run), "--resume", "--no-progress"]) == 0
    after = json.loads((g2p_run / "results.json").read_text())
    assert after["test_greedy"] == before["test_greedy"] and after["test_beam"] == before["test_beam"]


def test_bad_input_is_refused_with_the_fix(g2p_run, tmp_path, capsys):
    assert main(["predict", str(g2p_run), "42"]) == 2
    assert "digits" in capsys.readouterr().err
    assert main(["train", "--data", "cmudict", "--out", str(tmp_path / "x"), "--pooling", "cls"]) == 2
    assert "model.pooling do not apply to grapheme-to-phoneme" in capsys.readouterr().err
    assert main(["train", "--data", "cmudict", "--out", str(g2p_run), *SMALL]) == 2  # a run is there
    assert "--resume" in capsys.readouterr().err
