"""``memory_efficient``: exact attention in memory linear in length (FlashAttention's algorithm, in PyTorch).

Forward: for each block of queries, an online softmax over blocks of keys keeps a running max ``m``, normaliser ``l``
and output accumulator, so only a ``(block_q, block_k)`` tile of scores exists at a time; it also returns the
log-sum-exp ``lse = m + log l`` per query row. Backward (a custom ``autograd.Function``) recomputes each tile from
``q``, ``k`` and ``lse`` instead of storing ``Lq x Lk`` probabilities (FlashAttention-2's backward):
``dP = dO V^T``, ``dS = P * (dP - rowsum(P * dP))``, ``dQ = dS K scale``, ``dK = dS^T Q scale``, ``dV = P^T dO``.
Causal calls skip the tiles above the diagonal. Arithmetic is fp32 for fp16/bf16 inputs (the output is cast back; fp64 stays fp64), so low-precision inputs lose nothing to accumulation. Masks: bool (True = may attend) or float bias,
broadcastable to ``(b, h, i, j)``; a dense mask is itself ``Lq x Lk`` (use ``is_causal`` or a sparse backend for
structured patterns). No attention dropout, no weights from the kernel itself: :func:`weights_for` recovers the
weights of chosen heads / query rows from the saved ``lse`` without building the rest.

The loop above is the readable reference algorithm, and it is what runs on CPU. On CUDA the same algorithm runs as a
compiled kernel: PyTorch's FlexAttention (``torch.compile``-generated, forward and backward, tiles skipped by a causal
block mask from index arithmetic) with its log-sum-exp returned (:mod:`multihead.attention.flex_kernel`) -- a Python
loop of tile launches is ~250x slower than SDPA on an H200. ``kernel="tiles"`` forces the loop anywhere,
``kernel="flex"`` forces FlexAttention (on CPU its eager reference, forward only: for checking this route).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..masks import causal_allowed
from ..registry import Capabilities, register_backend
from ..ops import expand_kv

BLOCK_Q = 512
BLOCK_K = 512


def _tile(q_blk: Tensor, k_blk: Tensor, mask: Tensor | None, causal_offset: int | None, i0: int, j0: int) -> Tensor:
    """Scaled fp32 scores ``(b, h, bq, bk)`` of one tile with the mask applied (-inf where not allowed)."""
    s = torch.matmul(q_blk, k_blk.transpose(-2, -1))  # q_blk is pre-scaled
    bq, bk = s.shape[-2], s.shape[-1]
    if mask is not None:
        m = mask[..., i0 : i0 + bq, :] if mask.shape[-2] > 1 else mask  # size-1 axes broadcast: never slice them
        m = m[..., j0 : j0 + bk] if m.shape[-1] > 1 else m
        s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.to(s.dtype)
    if causal_offset is not None and j0 + bk - 1 > i0 + causal_offset:  # tile crosses the diagonal
        i = torch.arange(i0, i0 + bq, device=s.device)[:, None]
        j = torch.arange(j0, j0 + bk, device=s.device)[None, :]
        s = s.masked_fill(~causal_allowed(i, j, causal_offset), -math.inf)
    return s


def _forward(q, k, v, mask, causal_offset, scale, block_q, block_k):
    b, h, lq, d = q.shape
    lk = k.shape[2]
    out = torch.empty(b, h, lq, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, lq, 1, dtype=q.dtype, device=q.device)
    for i0 in range(0, lq, block_q):
        qi = q[:, :, i0 : i0 + block_q] * scale  # (b, h, bq, d)
        bq = qi.shape[2]
        m = torch.full((b, h, bq, 1), -math.inf, dtype=q.dtype, device=q.device)
        l = torch.zeros(b, h, bq, 1, dtype=q.dtype, device=q.device)
        acc = torch.zeros(b, h, bq, v.shape[-1], dtype=q.dtype, device=q.device)
        for j0 in range(0, lk, block_k):
            if causal_offset is not None and j0 > i0 + bq - 1 + causal_offset:
                break  # every later tile is above the diagonal
            s = _tile(qi, k[:, :, j0 : j0 + block_k], mask, causal_offset, i0, j0)  # (b, h, bq, bk)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with nothing yet
            p = torch.exp(s - shift)  # (b, h, bq, bk)
            corr = torch.exp(m - shift)
            l = l * corr + p.sum(-1, keepdim=True)
            acc = acc * corr + torch.matmul(p, v[:, :, j0 : j0 + block_k])  # (b, h, bq, d)
            m = m_new
        empty = l == 0  # no allowed key (the entry point never sends such rows; direct calls may)
        out[:, :, i0 : i0 + bq] = torch.where(empty, torch.zeros_like(acc), acc / l.clamp_min(1e-30))
        lse[:, :, i0 : i0 + bq] = torch.where(empty, torch.full_like(m, -math.inf), m + torch.log(l.clamp_min(1e-30)))
    return out, lse


def _backward(q, k, v, lse, dout, mask, causal_offset, scale, block_q, block_k):
    lq, lk = q.shape[2], k.shape[2]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    for i0 in range(0, lq, block_q):
        qi = q[:, :, i0 : i0 + block_q] * scale
        bq = qi.shape[2]
        doi, li = dout[:, :, i0 : i0 + bq], safe_lse[:, :, i0 : i0 + bq]
        # delta = rowsum(P * dP), summed tile by tile exactly as softmax's own backward does. (FlashAttention uses
        # the equal rowsum(dO * O); its different rounding leaves dQ, dK a few ulps off where they cancel to 0.)
        di = torch.zeros(qi.shape[:3] + (1,), dtype=q.dtype, device=q.device)
        for j0 in range(0, lk, block_k):
            if causal_offset is not None and j0 > i0 + bq - 1 + causal_offset:
                break
            p = torch.exp(_tile(qi, k[:, :, j0 : j0 + block_k], mask, causal_offset, i0, j0) - li)
            di += (p * torch.matmul(doi, v[:, :, j0 : j0 + block_k].transpose(-2, -1))).sum(-1, keepdim=True)
        dqi = torch.zeros_like(qi)
        for j0 in range(0, lk, block_k):
            if causal_offset is not None and j0 > i0 + bq - 1 + causal_offset:
                break
            kj, vj = k[:, :, j0 : j0 + block_k], v[:, :, j0 : j0 + block_k]
            p = torch.exp(_tile(qi, kj, mask, causal_offset, i0, j0) - li)  # (b, h, bq, bk), recomputed
            dv[:, :, j0 : j0 + block_k] += torch.matmul(p.transpose(-2, -1), doi)
            ds = p * (torch.matmul(doi, vj.transpose(-2, -1)) - di)  # (b, h, bq, bk)
            dqi += torch.matmul(ds, kj)
            dk[:, :, j0 : j0 + block_k] += torch.matmul(ds.transpose(-2, -1), qi)  # qi carries the scale
        dq[:, :, i0 : i0 + bq] = dqi * scale
    return dq, dk, dv


class _MemoryEfficient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal_offset, scale, block_q, block_k):
        work = torch.promote_types(q.dtype, torch.float32)  # fp32 for half types, fp64 stays fp64
        out, lse = _forward(q.to(work), k.to(work), v.to(work), mask, causal_offset, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, lse, mask if mask is not None else torch.empty(0))
        ctx.has_mask = mask is not None
        ctx.args = (causal_offset, scale, block_q, block_k)
        ctx.mark_non_differentiable(lse)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, lse, mask = ctx.saved_tensors
        causal_offset, scale, block_q, block_k = ctx.args
        work = torch.promote_types(q.dtype, torch.float32)
        dq, dk, dv = _backward(
            q.to(work),
            k.to(work),
            v.to(work),
            lse,
            dout.to(work),
            mask if ctx.has_mask else None,
            causal_offset,
            scale,
            block_q,
            block_k,
        )
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


KERNELS = ("auto", "tiles", "flex")


def memory_efficient_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    causal_offset: int | None = None,
    scale: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    kernel: str = "auto",
) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: ``out`` ``(b, h, i, d)`` exactly as softmax attention, ``lse`` ``(b, h, i, 1)`` (-inf for
    rows with no allowed key). ``k``/``v`` may have fewer heads (GQA). Causal is bottom-right aligned unless
    ``causal_offset`` says where query 0 sits (see :func:`multihead.masks.causal_mask`). ``kernel``: ``"auto"``
    (compiled FlexAttention on CUDA, the tile loop elsewhere), ``"tiles"`` or ``"flex"`` (see the module docstring)."""
    from ..flex_kernel import why_no_fast_flex

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if kernel == "flex" or (kernel == "auto" and why_no_fast_flex(q.device) is None):
        return _flex_route(q, k, v, mask, is_causal, causal_offset, scale)
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])  # (b, h, j, d); gradients flow back to the groups
    if mask is not None and mask.dim() < 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    offset = None if not is_causal else k.shape[2] - q.shape[2] if causal_offset is None else causal_offset
    return _MemoryEfficient.apply(q, k, v, mask, offset, scale, block_q, block_k)


def _flex_route(q, k, v, mask, is_causal, causal_offset, scale) -> tuple[Tensor, Tensor]:
    """The same exact attention and ``lse`` through FlexAttention (compiled on CUDA, eager on CPU)."""
    from ..attn_mask import AttnMask
    from ..flex_kernel import flex_attention

    cuda = q.device.type == "cuda"
    if not cuda and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("kernel='flex' has no backward on CPU (FlexAttention's limit); use kernel='tiles' or 'auto'")
    am = None
    if mask is not None or is_causal:
        offset = None if not is_causal else k.shape[2] - q.shape[2] if causal_offset is None else causal_offset
        am = AttnMask(tensor=mask, causal=is_causal, causal_offset=offset)
    out, lse = flex_attention(q, k, v, am, scale, lse=True, compiled=cuda)
    return out, lse.detach()[..., None].to(torch.promote_types(q.dtype, torch.float32))  # as the loop's


def weights_for(
    q: Tensor,
    k: Tensor,
    lse: Tensor,
    *,
    heads=None,
    rows=None,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """Softmax weights of chosen ``heads`` (indices) and query ``rows`` (indices) only, from the saved ``lse``:
    ``(b, len(heads), len(rows), j)``; nothing else of ``Lq x Lk`` is built."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    h_all, lq, lk = q.shape[1], q.shape[2], k.shape[2]
    heads = torch.arange(h_all) if heads is None else torch.as_tensor(heads)
    rows = torch.arange(lq) if rows is None else torch.as_tensor(rows)
    k = expand_kv(k, h_all)[:, heads]
    work = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q[:, heads][:, :, rows].to(work) * scale, k.to(work).transpose(-2, -1))  # (b, hs, rs, j)
    if mask is not None:
        m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)) if mask.dim() < 4 else mask
        m = m[:, heads if m.shape[1] > 1 else slice(None)][:, :, rows if m.shape[2] > 1 else slice(None)]
        s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.to(work)
    if is_causal:
        j = torch.arange(lk)[None, :]
        s = s.masked_fill(~causal_allowed(rows[:, None], j, lk - lq), -math.inf)
    l = lse[:, heads][:, :, rows]
    return torch.where(torch.isinf(l), torch.zeros_like(s), torch.exp(s - l)).to(q.dtype)


@register_backend(
    "memory_efficient",
    Capabilities(returns_weights=False, supports_dropout=False, mask_parts=("tensor", "causal")),
    priority=5,
    description="blockwise online softmax with a recomputing backward: exact, memory linear in length",
)
def memory_efficient_backend(q, k, v, *, mask, dropout_p, scale, need_weights):
    if mask is None:
        return memory_efficient_attention(q, k, v, scale=scale)[0], None
    out, _ = memory_efficient_attention(
        q, k, v, mask=mask.tensor, is_causal=mask.causal, causal_offset=mask.offset(q.shape[2], k.shape[2]), scale=scale
    )
    return out, None


__all__ = ["KERNELS", "memory_efficient_attention", "weights_for"]
