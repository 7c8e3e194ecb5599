"""Attention masks: one convention inside multihead, converters at the boundaries.

Shape legend: ``b`` batch, ``h`` query heads, ``i`` query positions (``Lq``), ``j`` key positions (``Lk``).

The one convention
------------------
A mask is either

* a **bool** tensor where ``True`` means *this query may attend to this key* (the convention of
  ``torch.nn.functional.scaled_dot_product_attention`` and of the tutorial's ``masked_fill(mask == 0, ...)``), or
* a **float** tensor added to the scores (an additive bias); ``-inf`` (or the dtype's most negative value, as
  HF transformers writes it) means *may not attend*.

Both are broadcastable to ``(b, h, i, j)``. Conversions from the other conventions in the wild live here and only
here: PyTorch ``nn.MultiheadAttention`` (``True`` = ignore) and HF transformers (``1`` = attend, ``0`` = pad).

A query row whose keys are all masked gives a zero output and zero weights (not NaN) on every backend.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

__all__ = [
    "causal_allowed",
    "causal_mask",
    "key_padding_mask",
    "from_torch_mask",
    "from_torch_key_padding_mask",
    "from_hf_attention_mask",
    "merge_masks",
    "is_masked",
    "check_mask",
]


def causal_allowed(i: Tensor, j: Tensor, offset: int) -> Tensor:
    """The causal rule, written once: query ``i`` (at absolute position ``i + offset``) may attend key ``j`` iff
    ``j <= i + offset``. Every causal mask, tile and ``mask_mod`` in multihead evaluates this on its own indices."""
    return j <= i + offset


def causal_mask(q_len: int, k_len: int | None = None, *, offset: int | None = None, device=None) -> Tensor:
    """Bool causal mask ``(Lq, Lk)``, True = may attend, aligned to the **bottom right** by default.

    Query ``i`` sits at absolute position ``i + (Lk - Lq)`` and may attend to keys ``j <= i + (Lk - Lq)``. With
    ``Lq == Lk`` this is the usual lower triangle. With a KV cache (``Lq < Lk``: new queries after cached keys)
    the last query sees every key::

        Lq = 2, Lk = 5          Lq = 5, Lk = 2
        1 1 1 1 0               0 0     <- no key: this row outputs zeros
        1 1 1 1 1               0 0
                                0 0
                                1 0
                                1 1

    This is FlashAttention's alignment (>= 2.1). Note that ``F.scaled_dot_product_attention(is_causal=True)`` aligns
    to the top left instead; multihead never relies on that for ``Lq != Lk``.

    ``offset`` overrides the alignment: query ``i`` sits at absolute position ``i + offset`` (a KV cache whose buffer
    holds ``Lk`` slots of which the first ``offset`` are filled: the empty slots lie in every query's future).
    """
    k_len = q_len if k_len is None else k_len
    offset = k_len - q_len if offset is None else offset
    i = torch.arange(q_len, device=device).unsqueeze(1)  # (i, 1)
    j = torch.arange(k_len, device=device).unsqueeze(0)  # (1, j)
    return causal_allowed(i, j, offset)  # (i, j)


def key_padding_mask(lengths: Tensor | list[int], max_len: int | None = None, *, device=None) -> Tensor:
    """Bool mask ``(B, 1, 1, Lk)`` from sequence lengths; True = a real token (may be attended)."""
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (one length per sequence), got shape {tuple(lengths.shape)}")
    max_len = int(lengths.max()) if max_len is None else max_len
    keep = torch.arange(max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # (b, j)
    return keep[:, None, None, :]  # (b, 1, 1, j)


def from_torch_mask(attn_mask: Tensor, num_heads: int | None = None) -> Tensor:
    """Convert ``nn.MultiheadAttention``'s ``attn_mask`` to multihead's convention.

    PyTorch: bool ``True`` = *not allowed* to attend; float = added to scores; shape ``(Lq, Lk)`` or
    ``(B * num_heads, Lq, Lk)``. Returns a mask broadcastable to ``(B, H, Lq, Lk)``.
    """
    if attn_mask.dim() == 3:
        if num_heads is None:
            raise ValueError("a 3-D PyTorch attn_mask is (B * num_heads, Lq, Lk): pass num_heads= to unflatten it")
        bh, lq, lk = attn_mask.shape
        attn_mask = attn_mask.view(bh // num_heads, num_heads, lq, lk)  # (b*h, i, j) -> (b, h, i, j)
    elif attn_mask.dim() != 2:
        raise ValueError(f"PyTorch attn_mask must be 2-D or 3-D, got {attn_mask.dim()}-D")
    if attn_mask.dtype == torch.bool:
        return ~attn_mask
    return attn_mask


def from_torch_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """``nn.MultiheadAttention``'s ``key_padding_mask`` ``(B, Lk)`` (True = pad) -> ours ``(B, 1, 1, Lk)`` (True =
    may attend), to pass as ``mask=`` (it broadcasts over heads and queries; ``key_padding_mask=`` takes ``(B, Lk)``
    True = real token). A float mask stays a bias."""
    if key_padding_mask.dtype == torch.bool:
        return (~key_padding_mask)[:, None, None, :]
    return key_padding_mask[:, None, None, :]


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """HF transformers' ``attention_mask`` ``(B, Lk)`` with 1 = attend, 0 = pad -> bool ``(B, 1, 1, Lk)``."""
    return (attention_mask != 0)[:, None, None, :]


def is_masked(mask: Tensor) -> Tensor:
    """Bool tensor, True where ``mask`` forbids attending (works for bool and additive float masks)."""
    if mask.dtype == torch.bool:
        return ~mask
    return torch.isneginf(mask) | (mask <= torch.finfo(mask.dtype).min)


def merge_masks(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """Combine two masks (either convention) so that a key is allowed only if both allow it."""
    if a is None:
        return b
    if b is None:
        return a
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    if a.dtype == torch.bool:
        a, b = b, a
    # a is float here
    if b.dtype == torch.bool:
        return a.masked_fill(~b, float("-inf"))
    return a + b


def check_mask(mask: Tensor, target: tuple[int, int, int, int], *, name: str = "mask") -> None:
    """Validate dtype and broadcastability of a mask against ``(B, H, Lq, Lk)``; raise with the fix."""
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"{name} has dtype {mask.dtype}; multihead masks are bool (True = may attend) or float (added to scores). "
            f"For a 0/1 integer mask use `{name}.bool()` (if 1 = attend) or `~{name}.bool()` (if 1 = ignore)."
        )
    if mask.dim() < 2:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} has fewer than 2 dims; a mask is (Lq, Lk) or larger, "
            "broadcastable to (B, H, Lq, Lk). Keys to ignore go in key_padding_mask= as (B, Lk)"
        )
    if mask.dim() > 4:
        raise ValueError(f"{name} has {mask.dim()} dims; expected at most 4, broadcastable to (B, H, Lq, Lk)={target}")
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    for got, want, axis in zip(shape, target, "B H Lq Lk".split()):
        if got not in (1, want):
            raise ValueError(
                f"{name} of shape {tuple(mask.shape)} does not broadcast to (B, H, Lq, Lk)={target}: "
                f"axis {axis} is {got}, expected 1 or {want}. "
                "A key-padding mask is (B, 1, 1, Lk) (see multihead.masks.key_padding_mask)."
            )


def warn_if_inverted_padding(mask: Tensor, name: str = "key_padding_mask") -> None:
    """Warn when a (B, Lk) padding mask looks like PyTorch's True = ignore convention."""
    if mask.dtype != torch.bool or mask.dim() != 2 or mask.shape[1] < 2:
        return
    first_masked_everywhere = not bool(mask[:, 0].any())
    some_kept = bool(mask.any())
    if first_masked_everywhere and some_kept:
        warnings.warn(
            f"{name}: the first token of every sequence is masked while later ones are kept. multihead uses "
            "True = real token (may attend); PyTorch's nn.MultiheadAttention uses True = padding. If this mask "
            f"came from PyTorch, pass `~{name}` (or multihead.masks.from_torch_key_padding_mask).",
            stacklevel=3,
        )
