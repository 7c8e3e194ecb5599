"""`multihead bench kv`'s multihead side on a small HF folder: the policy at each fraction, the head-aware split by a
given ranking, and the command's refusals before any model is read (the runs themselves: test_kv_ruler.py)."""

from __future__ import annotations


import pytest

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead.bench.kv import OursSide  # noqa: E402

from .test_attached_load_report import _save  # noqa: E402


def test_the_head_aware_split_follows_a_given_ranking_and_refuses_another_models(tmp_path):
    folder = _save(tmp_path / "llama", "llama", max_position_embeddings=512)
    ranking = [[0.0, 1.0], [0.5, 0.0]]  # a kv-heads.json's scores: layer 0 head 1 first, then layer 1 head 0
    side = OursSide(folder, ranking=ranking)
    assert side.split(0.5) == [[1], [0]]
    assert side.policy("head-aware", 0.5, 400).keep_all == ((1,), ())  # a quarter of the heads whole: half the bytes
    assert side.policy("snapkv", 0.25, 400).budget == 100
    assert "streaming" not in side.names() and "head-aware" in side.names()  # streaming rotates by slot: not HF's
    with pytest.raises(ValueError, match="classify this model's heads"):
        OursSide(folder, ranking=[[1.0]])


def test_bench_kv_refuses_bad_flags_before_reading_a_model(tmp_path, capsys):
    from multihead.cli import main

    out = tmp_path / "kv.json"
    bad = tmp_path / "kv-heads.json"
    bad.write_text('{"split": {"full_heads": [[0]]}}')
    cases = [
        (["--impls", "lru"], "knows no method lru"),
        (["--impls", "streaming"], "knows no method streaming"),
        (["--kv-heads", str(bad)], "holds no per-head scores"),
    ]
    for flags, message in cases:
        assert main(["bench", "kv", "--model", str(tmp_path / "nowhere"), *flags, "--out", str(out)]) == 2
        assert "config.json" in capsys.readouterr().err  # the folder is checked first
        folder = _save(tmp_path / "llama", "llama", max_position_embeddings=256)
        assert main(["bench", "kv", "--model", str(folder), "--lengths", "256", *flags, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert not out.exists() and bad.read_text() == '{"split": {"full_heads": [[0]]}}'


def test_a_fraction_is_as_many_keys_as_kvpress_keeps_and_earlier_runs_rule_is_kept(tmp_path):
    from multihead.bench.kv import BUDGETS, kept_keys

    assert kept_keys(0.125, 2047) == 255 and kept_keys(0.125, 2047, "round") == 256  # int(255.875), round(255.875)
    assert kept_keys(0.5, 4096) == kept_keys(0.5, 4096, "round") == 2048
    assert kept_keys(0.001, 100) == 1 and set(BUDGETS) == {"kvpress", "round"}
    try:
        from kvpress.utils import compute_n_kept
    except ImportError:
        pass
    else:  # kvpress's own count for the press bench kv makes (compression_ratio = 1 - fraction)
        for length in range(1, 3000, 7):
            for fraction in (0.1, 0.125, 0.25, 1 / 3, 0.5, 0.9):
                assert kept_keys(fraction, length) == compute_n_kept(length, 1 - fraction), (length, fraction)
    folder = _save(tmp_path / "llama", "llama", max_position_embeddings=512)
    ranking = [[0.0, 1.0], [0.5, 0.0]]
    with pytest.raises(ValueError, match="unknown budget rule 'floor'"):
        OursSide(folder, budget="floor")
    new, old = OursSide(folder, ranking=ranking, budget="kvpress"), OursSide(folder, ranking=ranking, budget="round")
    assert new.policy("snapkv", 0.125, 401).budget == 50 and old.policy("snapkv", 0.125, 401).budget == 50
    assert new.policy("window", 0.25, 401).budget == 100 and old.policy("window", 0.25, 401).budget == 100
    assert new.policy("snapkv", 0.375, 401).budget == 150 and old.policy("snapkv", 0.375, 401).budget == 150
    assert new.policy("snapkv", 0.3, 401).budget == 120 and old.policy("snapkv", 0.3, 401).budget == 120
    assert new.policy("snapkv", 0.3, 403).budget == 120 and old.policy("snapkv", 0.3, 403).budget == 121
    # the head-aware cache: 1 of 4 heads whole at 1/2; its three windowed heads never pass kvpress's bytes
    for length in (401, 403, 2047):
        held = length + 3 * new.policy("head-aware", 0.5, length).budget
        assert held <= 4 * kept_keys(0.5, length) < held + 3
