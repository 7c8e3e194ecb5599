"""Pretrained causal LMs (kept importable from here): :mod:`multihead.pretrained.causal_lm` holds the code, the
Llama, Gemma 3 and GPT-2 families are in :mod:`multihead.pretrained.families.causal` and GGUF files are read by
:mod:`multihead.pretrained.formats.gguf`.
"""

from __future__ import annotations

from ..pretrained.causal_lm import (  # noqa: F401
    SHORT_NAMES,
    LMError,
    PretrainedLM,
    bundle,
    export,
    is_lm_source,
    load,
    resolve,
)
from . import families, gguf_file  # noqa: F401,E402

__all__ = ["LMError", "PretrainedLM", "SHORT_NAMES", "export", "is_lm_source", "load", "resolve"]
