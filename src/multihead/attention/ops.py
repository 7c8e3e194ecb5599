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


def probabilities(q: Tensor, k: Tensor, mask: AttnMask | None, scale: float, sinks: Tensor | None = None) -> Tensor:
    """Softmax weights ``(b, h, i, j)`` in q's dtype under a structured ``mask`` (every part applied through its
    dense form); rows with no allowed key are zero. ``sinks`` ``(h,)``: a logit per head that joins every row's
    denominator (the rows then sum to ``1 - sink share``)."""
    k = expand_kv(k, q.shape[1])
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 for half types; fp64 stays fp64 (no silent rounding)
    scores = torch.matmul(q, k.transpose(-2, -1)).to(acc) * scale  # (b, h, i, j)
    dense = None if mask is None else mask.dense(q.shape[2], k.shape[2], q.device)
    row_ok = None
    if dense is not None:
        neg = -torch.finfo(acc).max
        if dense.dtype == torch.bool:
            scores = scores.masked_fill(~dense, neg)
            row_ok = dense.any(dim=-1, keepdim=True)
        else:
            # -inf entries become -max: no NaN in softmax, and clamp's gradient is zero there.
            scores = (scores + dense.to(acc)).clamp_min(neg)
            row_ok = (scores > neg).any(dim=-1, keepdim=True)
    if sinks is None:
        return zero_rows(torch.softmax(scores, dim=-1), row_ok).to(q.dtype)
    b, h, i, _ = scores.shape
    sink = sinks.to(acc).view(1, h, 1, 1).expand(b, h, i, 1)
    p = torch.softmax(torch.cat([sink, scores], -1), dim=-1)[..., 1:]  # the sink's share dropped
    return zero_rows(p, row_ok).to(q.dtype)


def with_sink_key(q: Tensor, k: Tensor, v: Tensor, mask: AttnMask | None, sinks: Tensor, scale: float):
    """Learned sinks as one extra key, exactly, for kernels that cannot take them: q ``(b, h, i, d)`` gains a feature
    ``sink_h / scale``, keys a 0 feature, and a first key (feature 1, value 0) scores ``sink_h`` for every query of
    head h (GQA included: the per-head logit rides on the query). The mask shifts by one key (an ALiBi part is made
    dense first, over the real keys). Returns ``q, k, v, mask``; the scale is unchanged."""
    from dataclasses import replace

    b, h, lq, d = q.shape
    g, lk = k.shape[1], k.shape[2]
    sink = (sinks.to(q.dtype) / scale).view(1, h, 1, 1).expand(b, h, lq, 1)
    q = torch.cat([q, sink], -1)
    first = torch.cat([k.new_zeros(b, g, 1, d), k.new_ones(b, g, 1, 1)], -1)
    k = torch.cat([first, torch.cat([k, k.new_zeros(b, g, lk, 1)], -1)], 2)  # (b, g, 1 + j, d + 1)
    v = torch.cat([v.new_zeros(b, g, 1, v.shape[-1]), v], 2)  # (b, g, 1 + j, dv)
    if mask is None:
        return q, k, v, None
    t = mask.tensor
    if mask.alibi is not None:  # distances are to the real keys: densified before the shift
        t = _masks.merge_masks(mask.alibi_bias(lq, lk, q.device, q.dtype), t)
    kp = (
        None
        if mask.key_padding is None
        else torch.cat([mask.key_padding.new_ones(mask.key_padding.shape[0], 1), mask.key_padding], 1)
    )
    if t is not None and t.shape[-1] != 1:
        col = torch.ones_like(t[..., :1]) if t.dtype == torch.bool else torch.zeros_like(t[..., :1])
        t = torch.cat([col, t], -1)
    offset = mask.offset(lq, lk) + 1 if mask.causal else None
    return q, k, v, replace(mask, key_padding=kp, tensor=t, alibi=None, causal_offset=offset, _checked=())


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


__all__ = ["expand_kv", "open_empty_rows", "probabilities", "with_sink_key", "zero_rows"]
