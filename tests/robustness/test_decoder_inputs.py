"""Hostile input to the decoder/G2P surface: bad words, corrupt G2P run folders, flags that do not apply. Each gets
exit 2 and a message naming the fix, no traceback, and nothing written."""

from __future__ import annotations

import json

import torch

import multihead as mh
from robust_helpers import run_cli


def _corrupt_run(tmp_path, config):
    run = tmp_path / "g2p"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_bad_words_are_refused_before_any_work(tmp_path):
    run = _corrupt_run(tmp_path, {"g2p": {}})
    for word, what in (("42", "digits"), ("naïve", "letters outside a-z"), ("a-b", "symbols")):
        out = tmp_path / "show"
        r = run_cli("show", run, word, "--out", out)
        assert r.returncode == 2 and what in r.stderr and not out.exists()
        r = run_cli("predict", run, word)
        assert r.returncode == 2 and ("vocab.json" in r.stderr or what in r.stderr)


def test_corrupt_g2p_run_folders_get_a_message(tmp_path):
    run = _corrupt_run(tmp_path, {"g2p": {"optim": {"epochs": "many"}}})
    before = (run / "config.json").read_bytes()
    r = run_cli("predict", run, "hello")
    assert r.returncode == 2 and "config.json" in r.stderr
    r = run_cli("evaluate", run)
    assert r.returncode == 2 and "config.json" in r.stderr
    assert (run / "config.json").read_bytes() == before and sorted(p.name for p in run.iterdir()) == ["config.json"]


def test_classifier_flags_do_not_apply_to_g2p_and_nothing_is_written(tmp_path):
    out = tmp_path / "run"
    r = run_cli("train", "--data", "cmudict", "--out", out, "--pooling", "cls")
    assert r.returncode == 2 and "do not apply to grapheme-to-phoneme" in r.stderr and not out.exists()
    r = run_cli("train", "--data", "cmudict", "--out", out, "--set", "optim.epochs=0")
    assert r.returncode == 2 and "epochs" in r.stderr and not out.exists()


def test_model_inputs_are_checked_before_allocation():
    lm = mh.CausalLM(
        vocab_size=20, max_len=8, decoder=mh.DecoderConfig(d_model=8, num_heads=2, num_layers=1, cross_attention=False)
    )
    for ids, match in (
        (torch.tensor([[1, 99]]), "outside"),
        (torch.tensor([[1.0, 2.0]]), "integer token ids"),
        (torch.ones(1, 9, dtype=torch.long), "beyond the 8 positions"),
    ):
        try:
            lm(ids)
        except (ValueError, TypeError) as exc:
            assert match in str(exc)
        else:
            raise AssertionError(f"{ids} was accepted")
