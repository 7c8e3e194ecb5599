"""multihead on the HF transformers models people already have: :func:`attach` gives a model's attention layers
multihead's kernel seam and hook points, so that ``capture``, ``run_with_cache``, ``ablated``, activation and
attribution patching and the exact statistics work on it through the same API as on multihead's own modules.

::

    from transformers import AutoModelForCausalLM
    from multihead import hf
    from multihead.modules import run_with_cache

    model = AutoModelForCausalLM.from_pretrained("path/to/folder")
    hf.attach(model)                       # outputs unchanged (to rounding); hooks cost nothing until used
    logits, cache = run_with_cache(model, ids, what=("pattern", "stats", "z"))
    hf.detach(model)                       # the model as it was

It needs ``transformers`` (``pip install 'multihead[hf]'``); nothing else of multihead does.
"""

from __future__ import annotations

from .attach import (
    NAME,
    AttachError,
    Attached,
    AttachedAttention,
    attach,
    attached,
    detach,
    is_attached,
    why_not,
)

__all__ = [
    "NAME",
    "AttachError",
    "Attached",
    "AttachedAttention",
    "attach",
    "attached",
    "detach",
    "is_attached",
    "why_not",
]
