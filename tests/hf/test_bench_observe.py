"""``multihead bench observe``: every case builds and runs in this process (the timings themselves are the bench's),
and the table says which ratio is against what."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead.bench import observe as bench  # noqa: E402


@pytest.mark.parametrize("impl", bench.IMPLS)
def test_each_case_builds_and_runs_what_it_names(impl):
    """Each timed step computes what its name says: the logits, or every layer's (1, 9, 16, 16) map."""
    step = bench.build({"impl": impl, "length": 16})
    got = step()
    if impl.endswith("maps"):
        assert len(got) == bench.SHAPE["num_hidden_layers"] and all(tuple(p.shape) == (1, 9, 16, 16) for p in got)
        assert all(torch.allclose(p.sum(-1), torch.ones(1, 9, 16)) for p in got)  # rows of probabilities
    else:
        assert tuple(got.shape) == (1, 16, bench.SHAPE["vocab_size"]) and bool(got.isfinite().all())


def test_an_unknown_case_is_refused_before_anything_runs(tmp_path, capsys):
    from multihead.cli import main

    out = tmp_path / "o.json"
    assert main(["bench", "observe", "--impls", "bare,nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err and not out.exists()


def test_the_table_names_each_ratios_base():
    payload = {
        "machine": {"cpu": "a CPU", "torch": "2", "threads": 2},
        "results": [
            {"impl": "bare", "length": 16, "seconds_min": 2.0},
            {"impl": "observed", "length": 16, "seconds_min": 2.1},
            {"impl": "eager_maps", "length": 16, "error": "exit 1: boom"},
        ],
    }
    bench._ratios(payload["results"])
    assert payload["results"][1]["time_vs_bare"] == pytest.approx(1.05)
    table = bench.format_table(payload)
    assert "a CPU" in table and "1.050  bare" in table and "exit 1: boom" in table
