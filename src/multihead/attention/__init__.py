"""Attention kernels behind one entry point, and the mask convention. See :mod:`.registry`."""

from . import masks
from .attn_mask import AttnMask
from .registry import (
    Backend,
    Capabilities,
    attention,
    attention_weights,
    list_backends,
    explain,
    explain_choice,
    get_backend,
    register_backend,
    resolve,
)
from . import backends as _backends  # noqa: F401  (registers reference, sdpa)

__all__ = [
    "AttnMask",
    "Backend",
    "Capabilities",
    "attention",
    "attention_weights",
    "list_backends",
    "explain",
    "explain_choice",
    "get_backend",
    "masks",
    "register_backend",
    "resolve",
]
