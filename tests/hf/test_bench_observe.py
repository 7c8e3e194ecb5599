"""``multihead bench observe``: every case builds and runs in this process (the timings themselves are the bench's),
and the table says which ratio is against what."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead.bench import observe as bench  # noqa: E402


@pytest.mark.parametrize("impl", bench.IMPLS)
def test_each_case_builds_and_runs(impl):
    step = bench.build({"impl": impl, "length": 16})
    step()
    step()


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
