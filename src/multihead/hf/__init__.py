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
    cache = hf.PolicyCache(model, "snapkv", budget=256)   # multihead's KV policies through HF's cache API
    model.generate(ids, past_key_values=cache, max_new_tokens=64)   # (transformers 5: cache=cache)
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


def __getattr__(name: str):
    if name == "PolicyCache":  # imported when first asked for (it subclasses transformers' Cache)
        from .cache import PolicyCache

        return PolicyCache
    raise AttributeError(f"module 'multihead.hf' has no attribute {name!r}")


__all__ = [
    "NAME",
    "PolicyCache",
    "AttachError",
    "Attached",
    "AttachedAttention",
    "attach",
    "attached",
    "detach",
    "is_attached",
    "why_not",
]
