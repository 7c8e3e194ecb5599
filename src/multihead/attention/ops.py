"""Operations every part of the kernel seam shares, written once: grouped-query key/value expansion and the
explicit softmax weights (the reference formula, also used for captured and hooked weights). No backend imports
another backend; they all import from here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from . import masks as _masks

if TYPE_CHECKING:
    from .attn_mask import AttnMask


def expand_kv(x: Tensor, num_heads: int) -> Tensor:
    """Repeat key/value heads for grouped-query attention: ``(b, g, j, d) -> (b, h, j, d)``."""
    b, g, j, d = x.shape
    if g == num_heads:
        return x
    return x[:, :, None].expand(b, g, num_heads // g, j, d).reshape(b, num_heads, j, d)  # (b, h, j, d)


def probabilities(q: Tensor, k: Tensor, mask: "AttnMask | None", scale: float) -> Tensor:
    """Softmax weights ``(b, h, i, j)`` in q's dtype under a structured ``mask`` (every part applied through its
    dense form); rows with no allowed key are zero."""
    k = expand_kv(k, q.shape[1])
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 for half types; fp64 stays fp64 (no silent rounding)
    scores = torch.matmul(q, k.transpose(-2, -1)).to(acc) * scale  # (b, h, i, j)
    dense = None if mask is None else mask.dense(q.shape[2], k.shape[2], q.device)
    if dense is None:
        return torch.softmax(scores, dim=-1).to(q.dtype)
    neg = -torch.finfo(acc).max
    if dense.dtype == torch.bool:
        scores = scores.masked_fill(~dense, neg)
        row_ok = dense.any(dim=-1, keepdim=True)
    else:
        # -inf entries become -max: no NaN in softmax, and clamp's gradient is zero there.
        scores = (scores + dense.to(acc)).clamp_min(neg)
        row_ok = (scores > neg).any(dim=-1, keepdim=True)
    return zero_rows(torch.softmax(scores, dim=-1), row_ok).to(q.dtype)


def open_empty_rows(mask: Tensor) -> tuple[Tensor, Tensor | None]:
    """Fully masked query rows, written once for every kernel that cannot take them (fused kernels return NaN
    there): ``(mask with those rows opened, row_ok)``, ``row_ok`` ``(b?, h?, i?, 1)`` bool or None when every row has
    a key. Run the kernel on the opened mask, then :func:`zero_rows` its output (and weights) with ``row_ok``: the
    rows come out exactly zero, with zero gradients."""
    allowed = mask if mask.dtype == torch.bool else ~_masks.is_masked(mask)
    row_ok = allowed.any(dim=-1, keepdim=True)
    if bool(row_ok.all()):
        return mask, None
    return (mask | ~row_ok if mask.dtype == torch.bool else mask.masked_fill(~row_ok, 0.0)), row_ok


def zero_rows(x: Tensor, row_ok: Tensor | None) -> Tensor:
    """``x`` with the rows where ``row_ok`` is False set to zero (see :func:`open_empty_rows`)."""
    return x if row_ok is None else x.masked_fill(~row_ok, 0.0)


__all__ = ["expand_kv", "open_empty_rows", "probabilities", "zero_rows"]
