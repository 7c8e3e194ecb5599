"""Operations every part of the kernel seam shares, written once: grouped-query key/value expansion and the
explicit softmax weights (the reference formula, also used for captured and hooked weights). No backend imports
another backend; they all import from here.
"""
from __future__ import annotations

import torch
from torch import Tensor


def expand_kv(x: Tensor, num_heads: int) -> Tensor:
    """Repeat key/value heads for grouped-query attention: ``(b, g, j, d) -> (b, h, j, d)``."""
    b, g, j, d = x.shape
    if g == num_heads:
        return x
    return x[:, :, None].expand(b, g, num_heads // g, j, d).reshape(b, num_heads, j, d)  # (b, h, j, d)


def probabilities(q: Tensor, k: Tensor, mask: Tensor | None, scale: float, is_causal: bool = False) -> Tensor:
    """Softmax weights ``(b, h, i, j)`` in q's dtype; rows with no allowed key are zero."""
    k = expand_kv(k, q.shape[1])
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 for half types; fp64 stays fp64 (no silent rounding)
    scores = torch.matmul(q, k.transpose(-2, -1)).to(acc) * scale  # (b, h, i, j)
    neg = -torch.finfo(acc).max
    row_ok = None
    if is_causal:
        lq, lk = q.shape[2], k.shape[2]
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + (lk - lq), neg)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, neg)
            row_ok = mask.any(dim=-1, keepdim=True)
        else:
            # -inf entries become -max: no NaN in softmax, and clamp's gradient is zero there.
            scores = (scores + mask.to(acc)).clamp_min(neg)
            row_ok = (scores > neg).any(dim=-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1)
    if row_ok is not None:
        weights = weights.masked_fill(~row_ok, 0.0)
    return weights.to(q.dtype)


__all__ = ["expand_kv", "probabilities"]
