"""Sparse backends that skip work: ``window`` (Longformer: sliding window, dilation, global tokens) and
``block_sparse`` (BigBird: window + global + random blocks). Both take a :class:`~multihead.attention.patterns.
SparsePattern` as ``mask`` and never build ``L x L``:

* ``window``: queries are cut into chunks of ``c`` (>= w); chunk ``n`` attends only the ``c + 2w`` keys around it
  (``unfold`` windows of the padded keys), the chunks on the batch axis of PyTorch's fused SDPA kernel with one
  band mask: ``O(L (c + 2w))`` time and memory. Dilation ``d`` splits the sequence into its ``d`` residue classes,
  each an undilated window. Global tokens (explicit softmax path) add ``G``
  key columns to every row and ``G`` dense rows.
* ``block_sparse``: per query block, the key blocks of the layout are gathered (``K`` blocks of ``b``):
  ``O(L K b)``; blocks outside the layout are never touched; global blocks' rows are dense.

Each equals the reference backend under ``pattern.dense(L)`` (tests). Arithmetic in fp32 for half types.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import causal_allowed
from ..ops import expand_kv, open_empty_rows, zero_rows
from ..patterns import SparsePattern, window_band
from ..registry import Capabilities, register_backend

NEG = -math.inf


def _softmax_rows(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last axis with ``allowed`` (broadcastable bool), in place on ``scores``; rows with nothing
    allowed give zeros (:func:`~multihead.attention.ops.open_empty_rows`)."""
    allowed, row_ok = open_empty_rows(allowed)
    scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    return zero_rows(torch.softmax(scores, dim=-1), row_ok)


def _fused(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """PyTorch's fused SDPA kernel under bool ``allowed``; query rows with no allowed key are opened for the kernel
    and zeroed after, as the entry point does for dense masks (one helper), so they give zeros, not NaN."""
    allowed, row_ok = open_empty_rows(allowed)
    return zero_rows(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale), row_ok)


def _dense_rows(
    q_rows: Tensor, rows: Tensor, k: Tensor, v: Tensor, key_ok: Tensor | None, causal: bool, scale: float
) -> Tensor:
    """Full attention for selected query ``rows`` (global tokens): ``(b, h, len(rows), d)``."""
    s = torch.matmul(q_rows * scale, k.transpose(-2, -1))  # (b, h, r, L)
    allowed = torch.ones_like(s, dtype=torch.bool)
    if key_ok is not None:
        allowed = allowed & key_ok[:, :, None, :]
    if causal:
        allowed = allowed & causal_allowed(rows[:, None], torch.arange(k.shape[2], device=k.device)[None, :], 0)
    return torch.matmul(_softmax_rows(s, allowed), v)


def _window_allowed(length: int, w: int, causal: bool, key_ok: Tensor | None, device):
    """Chunk geometry ``(c, nb, lp, span)`` and the allowed keys per chunk ``(b|1, 1|h, nb, c, span)``: chunks of
    ``c = max(w, 32)`` queries (their ``c + 2w`` keys hold the exact band; c = w keeps the K/V window copies at 3x),
    the ``(c, span)`` band shared by every chunk (query ``r`` sits at key offset ``w + r``), and the keys that are
    in range and real."""
    c = max(w, 32)
    lp = -(-length // c) * c
    nb, span = lp // c, c + 2 * w
    qi = torch.arange(c, device=device)[:, None] + w  # query r of a chunk sits at key offset w + r
    kj = torch.arange(span, device=device)[None, :]
    band = window_band(qi - kj, w) & (causal_allowed(qi, kj, 0) if causal else True)  # (c, span): the pattern's rule
    ok = torch.ones(1, 1, length, dtype=torch.bool, device=device) if key_ok is None else key_ok
    ok = F.pad(ok, (w, lp - length + w)).unfold(2, span, c)  # (b|1, 1|h, nb, span)
    return (c, nb, lp, span), band & ok[:, :, :, None, :]


def _window_fused(q, k, v, w: int, causal: bool, key_ok: Tensor | None, scale: float) -> Tensor:
    """Undilated window without global tokens, each query chunk attended by PyTorch's fused SDPA kernel: chunks go
    to the batch axis ``(b * nb, h, c, d)`` against their ``c + 2w`` keys, with the chunk's band mask (edges and
    padding), so no softmax pass is written out in Python. ``key_ok`` ``(b, 1|h, L)``."""
    b, h, length, d = q.shape
    (c, nb, lp, span), allowed = _window_allowed(length, w, causal, key_ok, q.device)

    def windows(t):  # (b, h, L, x) -> (b * nb, h, span, x): each chunk's keys (one copy)
        t = F.pad(t, (0, 0, w, lp - length + w)).unfold(2, span, c)  # (b, h, nb, x, span)
        return t.permute(0, 2, 1, 4, 3).reshape(b * nb, h, span, -1)

    qc = F.pad(q, (0, 0, 0, lp - length)).view(b, h, nb, c, d).transpose(1, 2).reshape(b * nb, h, c, d)
    hm = allowed.shape[1]  # 1, or h when the key mask differs per head (dilation's residue classes)
    allowed = allowed.expand(b, hm, nb, c, span).transpose(1, 2).reshape(b * nb, hm, c, span)
    out = _fused(qc, windows(k), windows(v), allowed, scale)  # padded queries far from real keys see nothing
    return out.view(b, nb, h, c, -1).transpose(1, 2).reshape(b, h, lp, -1)[:, :, :length]


def _window_global(q, k, v, w: int, causal: bool, key_ok: Tensor | None, globals_: list[int], scale: float):
    """Undilated window plus global tokens: window keys and the ``G`` global keys share one softmax (global keys are
    masked out of the window part so they count once); global queries get dense rows. ``key_ok`` ``(b, 1, L)``."""
    b, h, length, d = q.shape
    ok = torch.ones(1, 1, length, dtype=torch.bool, device=q.device) if key_ok is None else key_ok.clone()
    ok[..., globals_] = False
    (c, nb, lp, span), allowed = _window_allowed(length, w, causal, ok, q.device)  # (b|1, 1, nb, c, span)
    q_blk = F.pad(q * scale, (0, 0, 0, lp - length)).view(b, h, nb, c, d)  # (b, h, nb, c, d)
    k_win = F.pad(k, (0, 0, w, lp - length + w)).unfold(2, span, c)  # (b, h, nb, d, span): a strided view
    v_win = F.pad(v, (0, 0, w, lp - length + w)).unfold(2, span, c).transpose(-2, -1)  # (b, h, nb, span, dv)
    g = torch.tensor(globals_, dtype=torch.long, device=q.device)
    s = torch.matmul(q_blk, k_win)  # (b, h, nb, c, span)
    sg = torch.matmul(q_blk, k[:, :, g].transpose(-2, -1)[:, :, None])  # (b, h, nb, c, G)
    allowed_g = torch.ones(1, 1, nb, c, len(globals_), dtype=torch.bool, device=q.device)
    if causal:
        allowed_g = allowed_g & causal_allowed(
            torch.arange(lp, device=q.device).view(1, 1, nb, c, 1), g.view(1, 1, 1, 1, -1), 0
        )
    if key_ok is not None:
        allowed_g = allowed_g & key_ok[:, :, g][:, :, None, None, :]
    lead = max(allowed.shape[0], allowed_g.shape[0])
    both = torch.cat([allowed.expand(lead, -1, -1, -1, -1), allowed_g.expand(lead, -1, -1, -1, -1)], -1)
    p = _softmax_rows(torch.cat([s, sg], -1), both)  # one softmax over window and global keys
    out = torch.matmul(p[..., :span], v_win) + torch.matmul(p[..., span:], v[:, :, g][:, :, None])
    out = out.reshape(b, h, lp, -1)[:, :, :length]
    out[:, :, g] = _dense_rows(q[:, :, g], g, k, v, key_ok, causal, scale)
    return out


def window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: SparsePattern,
    scale: float | None = None,
    *,
    key_padding: Tensor | None = None,
) -> Tensor:
    """Sliding-window attention ``(b, h, L, d)`` for ``pattern`` (``window``, ``dilation``, ``global_tokens``,
    ``causal``) over real keys ``key_padding`` ``(b, L)`` bool; see the module docstring."""
    if pattern.kind != "window":
        raise ValueError("window_attention needs SparsePattern(window=...); use block_sparse for block patterns")
    b, h, length, d = q.shape
    scale = d**-0.5 if scale is None else scale
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)
    q, k, v = q.to(work), expand_kv(k, h).to(work), expand_kv(v, h).to(work)
    key_ok = None if key_padding is None else key_padding[:, None, :].to(q.device)  # (b, 1, L)
    globals_ = sorted(t for t in set(pattern.global_tokens) if 0 <= t < length)
    dil = pattern.dilation
    if dil == 1 and globals_:
        return _window_global(q, k, v, pattern.window_size, pattern.causal, key_ok, globals_, scale).to(dtype)
    if dil == 1:
        return _window_fused(q, k, v, pattern.window_size, pattern.causal, key_ok, scale).to(dtype)
    if globals_:
        raise ValueError("global tokens with dilation > 1 are not supported; use dilation=1 or no global tokens")
    lp = -(-length // dil) * dil  # residue classes: position p -> class p % dil, index p // dil

    def split(t):  # (b, h, L, x) -> (b, h * dil, lp / dil, x)
        t = F.pad(t, (0, 0, 0, lp - length))
        return t.view(b, h, lp // dil, dil, -1).transpose(2, 3).reshape(b, h * dil, lp // dil, -1)

    ok = torch.ones(b, 1, length, dtype=torch.bool, device=q.device) if key_ok is None else key_ok
    ok = F.pad(ok, (0, lp - length)).view(b, 1, lp // dil, dil).transpose(2, 3)  # (b, 1, dil, lp/dil)
    ok = ok.expand(b, h, dil, lp // dil).reshape(b, h * dil, lp // dil)
    out = _window_fused(split(q), split(k), split(v), pattern.window_size, pattern.causal, ok, scale)
    out = out.view(b, h, dil, lp // dil, -1).transpose(2, 3).reshape(b, h, lp, -1)[:, :, :length]
    return out.to(dtype)


def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: SparsePattern,
    scale: float | None = None,
    *,
    key_padding: Tensor | None = None,
) -> Tensor:
    """BigBird-style block-sparse attention ``(b, h, L, d)`` over real keys ``key_padding`` ``(b, L)`` bool; only the
    layout's key blocks are computed."""
    if pattern.kind != "block":
        raise ValueError("block_sparse_attention needs SparsePattern(block=...)")
    b, h, length, d = q.shape
    scale = d**-0.5 if scale is None else scale
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)
    q, k, v = q.to(work), expand_kv(k, h).to(work), expand_kv(v, h).to(work)
    bs = pattern.block_size
    nb = -(-length // bs)
    lp = nb * bs
    layout = pattern.block_layout(nb).to(q.device)  # (nb, nb)
    g = min(pattern.global_blocks, nb)
    counts = layout.sum(-1)
    kmax = int(counts[g:].max()) if nb > g else 1
    idx = torch.zeros(nb, kmax, dtype=torch.long, device=q.device)
    valid = torch.zeros(nb, kmax, dtype=torch.bool, device=q.device)
    for i in range(g, nb):
        cols = layout[i].nonzero().flatten()
        idx[i, : len(cols)] = cols
        valid[i, : len(cols)] = True
    key_ok = (
        torch.ones(b, length, dtype=torch.bool, device=q.device) if key_padding is None else key_padding.to(q.device)
    )
    key_ok = F.pad(key_ok, (0, lp - length)).view(b, 1, nb, bs)  # (b, 1, nb, bs)
    q_blk = F.pad(q, (0, 0, 0, lp - length)).view(b, h, nb, bs, d)
    k_blk = F.pad(k, (0, 0, 0, lp - length)).view(b, h, nb, bs, d)
    v_blk = F.pad(v, (0, 0, 0, lp - length)).view(b, h, nb, bs, -1)
    rows = torch.arange(g, nb, device=q.device)
    sel = idx[rows]  # (nr, K)
    nr = len(rows)

    def gather(t):  # (b, h, nb, bs, x) -> (b * nr, h, K * bs, x): each row block's key blocks, gathered once
        return t[:, :, sel].reshape(b, h, nr, kmax * bs, -1).transpose(1, 2).reshape(b * nr, h, kmax * bs, -1)

    kpos = (sel[:, :, None] * bs + torch.arange(bs, device=q.device)).reshape(nr, kmax * bs)
    qpos = rows[:, None] * bs + torch.arange(bs, device=q.device)  # (nr, bs)
    allowed = valid[rows].repeat_interleave(bs, dim=1)[:, None, :].expand(-1, bs, -1)  # (nr, bs, K*bs)
    if pattern.causal:
        allowed = allowed & causal_allowed(qpos[:, :, None], kpos[:, None, :], 0)
    ok = key_ok[:, 0, sel].reshape(b, nr, 1, kmax * bs)
    allowed = (allowed[None] & ok).reshape(b * nr, 1, bs, kmax * bs)
    qr = q_blk[:, :, rows].transpose(1, 2).reshape(b * nr, h, bs, d)
    # The row blocks go on the batch axis of PyTorch's fused kernel: no Python-level softmax.
    body = _fused(qr, gather(k_blk), gather(v_blk), allowed, scale)
    body = body.view(b, nr, h, bs, -1).transpose(1, 2)  # (b, h, nr, bs, dv)
    out = torch.zeros(b, h, lp, v.shape[-1], dtype=work, device=q.device)
    out[:, :, g * bs :] = body.reshape(b, h, -1, v.shape[-1])
    if g:
        grow = torch.arange(min(g * bs, length), device=q.device)
        out[:, :, : len(grow)] = _dense_rows(
            q[:, :, grow], grow, k, v, key_ok.view(b, 1, lp)[..., :length], pattern.causal, scale
        )
    return out[:, :, :length].to(dtype)


def _pattern(mask):
    """The call's pattern with its causal part (the registry hands these backends only pattern, padding, causal)."""
    if mask is None or mask.pattern is None:
        raise ValueError("this backend runs sparse patterns only: pass mask=SparsePattern(...)")
    return mask.pattern.with_causal(mask.causal)


@register_backend(
    "window",
    Capabilities(
        returns_weights=False,
        supports_dropout=False,
        mask_parts=("key_padding", "causal_square"),
        patterns=("window",),
        requires_pattern=True,
    ),
    priority=20,
    description="sliding window (+ dilation, global tokens), O(L w) time and memory; SparsePattern masks",
)
def window_backend(q, k, v, *, mask, dropout_p, scale, need_weights):
    return window_attention(q, k, v, _pattern(mask), scale, key_padding=mask.key_padding), None


@register_backend(
    "block_sparse",
    Capabilities(
        returns_weights=False,
        supports_dropout=False,
        mask_parts=("key_padding", "causal_square"),
        patterns=("block",),
        requires_pattern=True,
    ),
    priority=20,
    description="BigBird block-sparse (window + global + random blocks), skips empty blocks; SparsePattern masks",
)
def block_sparse_backend(q, k, v, *, mask, dropout_p, scale, need_weights):
    return block_sparse_attention(q, k, v, _pattern(mask), scale, key_padding=mask.key_padding), None


__all__ = ["block_sparse_attention", "window_attention"]
