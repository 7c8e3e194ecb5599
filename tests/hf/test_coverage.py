"""Attach over the model types transformers' own auto tables list (see tests/hf/coverage.py). ``make test`` runs a
fixed sample spanning every kind; ``make coverage`` runs every type (about 300 under transformers 5, 10 minutes)
and writes docs/attach-coverage.md. Either way: an attached type that disagrees with HF fails, and every type that
is not attached carries its reason."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from .coverage import survey, types  # noqa: E402

SAMPLE = {
    "bart",
    "bert",
    "bloom",
    "clip",
    "codegen",
    "deberta",
    "falcon",
    "gemma2",
    "gpt2",
    "gpt_neo",
    "gpt_neox",
    "llama",
    "m2m_100",
    "mamba",
    "marian",
    "mistral",
    "mixtral",
    "mt5",
    "olmo2",
    "opt",
    "pegasus",
    "phi3",
    "qwen2",
    "qwen3_moe",
    "roberta",
    "speech_to_text",
    "swin",
    "t5",
    "vit",
    "wav2vec2",
    "whisper",
    "xglm",
}
ALL = os.environ.get("MULTIHEAD_COVERAGE") == "all"
SELECTED = [t for t in types() if ALL or t[0] in SAMPLE]


@pytest.mark.parametrize("entry", SELECTED, ids=[t[0] for t in SELECTED])
def test_attached_types_equal_hf_and_the_rest_say_why(entry):
    (row,) = survey([entry])
    if row.stage == "attached":
        assert row.agrees, row
    else:
        assert row.stage in ("refused", "not built", "small config fails") and len(row.why) > 10, row
