"""Every row of the survey of models that are not HF's (``observe_survey.py``, whose table is
docs/observe-coverage.md): untouched outputs (no call replaced), every pattern equal to the model's own, and head
ablation equal to zeroing the head's columns of its output projection; or, where the survey says the observer
refuses a model, refused with that reason."""

from __future__ import annotations

import importlib.util
import re

import pytest
from observe_survey import ROWS, check


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_each_model_observed_agrees_with_its_own_computation(row):
    if row.needs and importlib.util.find_spec(row.needs) is None:
        where = "make vision" if row.needs in ("torchvision", "timm", "open_clip") else "make"
        pytest.skip(f"{row.library} is not installed here (`{where}` makes the environment it runs in)")
    r = check(row)
    if row.refused:
        assert re.search(row.refused, r.get("refused", "")), r  # refused, by name, for the reason the survey says
        return
    assert "refused" not in r, r["refused"]
    assert r["untouched"]  # nothing captured: no call replaced
    assert r["untouched_diff"] <= 1e-5 * max(1.0, r["scale"])
    assert r["outputs"] <= 1e-5 * max(1.0, r["scale"])  # captured: the same model to rounding
    assert r["patterns"] <= 1e-5  # every site's weights
    assert r["site_effect"] > 1e-3  # the head mattered where it is (at the output it may be damped by later layers)
    if r["ablation"] is not None:
        assert r["ablation"] <= 1e-5 * max(1.0, r["scale"])
