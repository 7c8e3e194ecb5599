"""Exact per-head attention statistics in memory linear in length: what every head does, without the ``L x L`` map.

Fused kernels never write the attention map, which is why PyTorch, FlashAttention and xformers return no weights
(pytorch#98505, flash-attention#106). The map is not needed for its summaries: with the row log-sum-exp
``lse_i = log sum_j exp(s_ij)`` every weight is ``p_ij = exp(s_ij - lse_i)``, computable tile by tile. So
:func:`attention_stats` runs two passes over ``(block_q, block_k)`` tiles of scores -- the memory-efficient kernel's
online softmax for ``lse``, then the statistics from exact weights -- and holds one tile at a time::

    entropy[b, h, i]   = -sum_j p log p = lse_i - sum_j p_ij s_ij        (nats; 0 for a row with one key)
    received[b, h, j]  = sum_i p_ij                                       (column sums: H2O's heavy hitters, sinks)
    distance[b, h, i]  = sum_j p_ij |pos(i) - j|                          (mean attention distance, in tokens)
    mass[name][b,h,i]  = sum_{j in set} p_ij                              ("first": the first token; any key sets)
    mass["offset-1"]   = p_{i, pos(i)-1}                                  (previous token; any relative offsets)
    top-k              = the k largest p_ij per row, with their key indices
    weights            = exact rows p_i. for chosen heads and query rows only

``pos(i) = i + offset`` places query ``i`` among the keys (``Lk - Lq``, bottom-right, as the causal rule; 0 for
self-attention). Every mask the kernel seam takes works -- key padding, causal (with an offset), sparse patterns
(their index rule, never a dense map), bool/float tensors -- and GQA. Tiles a mask forbids entirely are skipped.
Rows with no allowed key have ``lse = -inf`` and zero weights, entropy, distance and mass (no NaN).

With learned sinks (``sinks=``, a logit per head in every denominator) ``lse`` includes the sink's term, so every
statistic is over the real keys with their true weights (which sum to ``1 - sink[b, h, i]``, the sink's share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .attn_mask import AttnMask
from .masks import causal_allowed
from .ops import expand_kv

BLOCK_Q = 64  # 64 x 1024 tiles: at 16k, 47 MiB peak and 11.0 s; 256 x 1024: 169 MiB, 10.4 s (measured)
BLOCK_K = 1024


@dataclass
class AttentionStats:
    """Per-head statistics of one attention call; ``b`` batch, ``h`` query heads, ``i`` queries, ``j`` keys."""

    lse: Tensor  # (b, h, i) row log-sum-exp of the scaled, masked scores (-inf: no allowed key)
    entropy: Tensor  # (b, h, i) nats
    received: Tensor  # (b, h, j) attention each key receives, summed over queries
    distance: Tensor  # (b, h, i) expected |pos(i) - j| in tokens
    mass: dict[str, Tensor] = field(default_factory=dict)  # name -> (b, h, i) mass on a key set ("first" always)
    topk_index: Tensor | None = None  # (b, h, i, k) key indices, largest weight first
    topk_weight: Tensor | None = None  # (b, h, i, k)
    weights: Tensor | None = None  # (b, len(heads), len(rows), j) exact rows, when heads/rows were asked for
    thumbnail: Tensor | None = None  # (b, h, T, T): the map averaged over T x T bins of rows and keys (a picture)
    heads: list[int] | None = None
    rows: list[int] | None = None
    sink: Tensor | None = None  # (b, h, i) the learned sink's share of each row (models with sinks)

    @property
    def allowed_rows(self) -> Tensor:
        """``(b, h, i)`` bool: rows that had at least one key."""
        return torch.isfinite(self.lse) if self.sink is None else self.sink < 1

    def nbytes(self) -> int:
        ts = [
            self.lse,
            self.entropy,
            self.received,
            self.distance,
            *self.mass.values(),
            self.topk_index,
            self.topk_weight,
            self.weights,
            self.thumbnail,
            self.sink,
        ]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _key_sets(sets: dict | None, b: int, lk: int, device) -> dict[str, Tensor]:
    """Key sets as ``(b, j)`` bool: ``"first"`` always, plus each given set (indices, or a bool ``(j,)``/``(b, j)``)."""
    out = {"first": torch.zeros(b, lk, dtype=torch.bool, device=device)}
    if lk:
        out["first"][:, 0] = True
    for name, s in (sets or {}).items():
        s = torch.as_tensor(s, device=device)
        if s.dtype == torch.bool:
            if s.shape not in ((lk,), (b, lk)):
                raise ValueError(
                    f"key set {name!r} as a bool mask must be (Lk,) or (B, Lk) = ({b}, {lk}); got {tuple(s.shape)}"
                )
            out[name] = s.expand(b, lk).clone()
        else:
            if s.dim() != 1 or s.is_floating_point() or (s.numel() and (int(s.min()) < 0 or int(s.max()) >= lk)):
                raise ValueError(
                    f"key set {name!r} must be key indices in [0, {lk}) or a bool mask; got {s.tolist()[:8]}"
                )
            m = torch.zeros(b, lk, dtype=torch.bool, device=device)
            m[:, s] = True
            out[name] = m
    return out


def _fused_lse(q: Tensor, k: Tensor, am: AttnMask | None, scale: float, work) -> Tensor | None:
    """The row log-sum-exp from one fused kernel where there is one: on CUDA, compiled FlexAttention with every part
    of the mask (:mod:`multihead.attention.flex_kernel`); on CPU, PyTorch's fused flash kernel (it returns it beside
    the output) for calls with no mask or a square causal one. None otherwise (the tiled pass computes it)."""
    from .flex_kernel import flex_attention, why_no_fast_flex

    if why_no_fast_flex(q.device) is None:
        return flex_attention(q, k, k, am, scale, lse=True)[1].to(work)
    lq, lk = q.shape[2], k.shape[2]
    causal = am is not None and am.parts == {"causal"} and am.square_causal(lq, lk)
    if q.device.type != "cpu" or q.dtype != torch.float32 or (am is not None and not causal):
        return None
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None:
        return None
    try:
        _, lse = op(q, k, k, 0.0, causal, scale=scale)
    except RuntimeError:
        return None
    return lse.to(work) if lse.shape == q.shape[:3] else None


class _Tiles:
    """Scores of one tile with every part of the mask applied from index arithmetic (no dense map)."""

    def __init__(self, q: Tensor, k: Tensor, am: AttnMask | None, scale: float, work: torch.dtype) -> None:
        self.q, self.k, self.scale, self.work = q, k, scale, work
        b, h, lq, _ = q.shape
        lk = k.shape[2]
        # plain causal: applied by index arithmetic on the tiles that cross the diagonal only (see scores)
        self.mask_mod = am.mask_mod(lq, lk, q.device) if am is not None and am.parts != {"causal"} else None
        self.score_mod = am.score_mod(lq, lk, q.device) if am is not None else None
        self.causal_offset = am.offset(lq, lk) if am is not None and am.causal else None
        self.b_idx = torch.arange(b, device=q.device)[:, None, None, None]
        self.h_idx = torch.arange(h, device=q.device)[None, :, None, None]

    def skip(self, i0: int, bq: int, j0: int) -> bool:
        """Whether the causal rule forbids the whole tile (every key after every query)."""
        return self.causal_offset is not None and j0 > i0 + bq - 1 + self.causal_offset

    def scores(self, i0: int, i1: int, j0: int, j1: int, fill: float = -math.inf) -> Tensor | None:
        """``(b, h, bq, bk)`` scaled scores, ``fill`` where masked; None when the mask forbids the whole tile."""
        ii = torch.arange(i0, i1, device=self.q.device)[None, None, :, None]
        jj = torch.arange(j0, j1, device=self.q.device)[None, None, None, :]
        allowed = None
        if self.mask_mod is not None:
            allowed = self.mask_mod(self.b_idx, self.h_idx, ii, jj)
            if not bool(allowed.any()):
                return None
        s = torch.matmul(
            self.q[:, :, i0:i1].to(self.work) * self.scale, self.k[:, :, j0:j1].to(self.work).transpose(-2, -1)
        )
        if self.score_mod is not None:
            s = self.score_mod(s, self.b_idx, self.h_idx, ii, jj)
        if allowed is None and self.causal_offset is not None and j1 - 1 > i0 + self.causal_offset:
            allowed = causal_allowed(ii, jj, self.causal_offset)  # plain causal, a tile across the diagonal
        if allowed is not None:
            s = s.masked_fill_(~allowed, fill)
        if fill != -math.inf and self.score_mod is not None:
            s = s.clamp_min_(fill)  # a -inf in a float bias
        return s


def _tile_topk(p: Tensor, k: int, chunk: int = 32) -> tuple[Tensor, Tensor]:
    """``p.topk(k, -1)`` of a tile, faster: the row's top k lie in the k chunks (of ``chunk`` keys) with the largest
    maxima -- a chunk holding a top-k weight has at most k - 1 chunks with larger maxima -- so only those are sorted."""
    n = p.shape[-1]
    if n % chunk or n // chunk <= k:
        return p.topk(min(k, n), dim=-1)
    pc = p.unflatten(-1, (n // chunk, chunk))  # (..., chunks, chunk)
    _, ci = pc.amax(-1).topk(k, dim=-1)  # (..., k) the chunks
    cand = pc.gather(-2, ci[..., None].expand(*ci.shape, chunk)).flatten(-2)  # (..., k * chunk)
    w, ix = cand.topk(k, dim=-1)
    return w, ci.gather(-1, ix // chunk) * chunk + ix % chunk


def _as_list(x, n: int, what: str) -> list[int] | None:
    if x is None:
        return None
    out = [int(v) for v in torch.as_tensor(x).flatten().tolist()]
    bad = [v for v in out if not 0 <= v < n]
    if bad or not out:
        raise ValueError(f"{what} must be indices in [0, {n}); got {out[:8]}")
    return out


@torch.no_grad()
def attention_stats(
    q: Tensor,
    k: Tensor,
    *,
    mask=None,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    topk: int = 8,
    sets: dict | None = None,
    offsets=(),
    heads=None,
    rows=None,
    thumbnail: int = 0,
    sinks: Tensor | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> AttentionStats:
    """Exact statistics of ``softmax(q k^T * scale + mask)`` per head, in memory linear in length.

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, Hkv, Lk, D)`` with ``H % Hkv == 0`` (GQA).
        mask, is_causal: as :func:`multihead.attention.attention` takes them (tensor, SparsePattern, AttnMask).
        key_padding_mask: ``(B, Lk)`` bool, True = real key.
        topk: keys kept per query row (0: none).
        sets: extra key sets, ``{name: indices or bool (Lk,)/(B, Lk)}``; their mass per row is in ``.mass``.
        offsets: relative key offsets (``-1``: the previous token, ``0``: itself); the weight there is in
            ``.mass["offset-1"]`` ... (0 where that key does not exist).
        heads, rows: return the exact weight rows of these heads and query rows (``.weights``).
        thumbnail: ``T > 0`` also returns the map averaged over ``T x T`` bins (``.thumbnail``; bin ``a`` of
            ``L`` positions holds ``[a L / T, (a + 1) L / T)``), two thin matmuls per tile.
        sinks: ``(H,)`` learned sink logits (as the kernel seam takes them): they join each row's denominator; the
            statistics stay over the real keys and ``.sink`` holds each row's sink share.
    """
    from .registry import _check_qkv, _check_sinks

    _check_qkv(q, k, k)
    _check_sinks(sinks, q)
    b, h, lq, d = q.shape
    lk = k.shape[2]
    if topk < 0 or block_q < 1 or block_k < 1:
        raise ValueError(
            f"topk must be >= 0 and the blocks >= 1; got topk={topk}, block_q={block_q}, block_k={block_k}"
        )
    am = AttnMask.of(mask, is_causal=is_causal, key_padding=key_padding_mask)
    if am is not None:
        am = am.check(b, h, lq, lk, q.device, q.dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    heads_l, rows_l = _as_list(heads, h, "heads"), _as_list(rows, lq, "rows")
    if (heads_l is None) != (rows_l is None):
        heads_l = heads_l if heads_l is not None else list(range(h))
        rows_l = rows_l if rows_l is not None else list(range(lq))
    key_sets = _key_sets(sets, b, lk, q.device)
    work = torch.promote_types(q.dtype, torch.float32)
    k = expand_kv(k, h)
    tiles = _Tiles(q, k, am, scale, work)
    pos_offset = lk - lq if am is None or am.causal_offset is None else am.causal_offset
    kk = min(topk, lk)

    def zeros(*shape):
        return torch.zeros(*shape, dtype=work, device=q.device)

    lse = _fused_lse(q, k, am, scale, work)  # one fused kernel when the mask allows it, else None
    if lse is None:
        lse = torch.empty(b, h, lq, dtype=work, device=q.device)
        for i0 in range(0, lq, block_q):  # pass 1: the row log-sum-exp, combined across key tiles
            i1 = min(i0 + block_q, lq)
            acc = torch.full((b, h, i1 - i0), -math.inf, dtype=work, device=q.device)
            for j0 in range(0, lk, block_k):
                if tiles.skip(i0, i1 - i0, j0):
                    break
                s = tiles.scores(i0, i1, j0, min(j0 + block_k, lk))
                if s is not None:
                    acc = torch.logaddexp(acc, torch.logsumexp(s, -1))
            lse[:, :, i0:i1] = acc
    sink = None
    if sinks is not None:  # the sink's term joins every denominator: p over the real keys sums to 1 - its share
        logit = sinks.to(work).view(1, h, 1).expand(b, h, lq)
        lse = torch.logaddexp(lse, logit)
        sink = torch.exp(logit - lse)
    entropy, distance, received = zeros(b, h, lq), zeros(b, h, lq), zeros(b, h, lk)
    names = list(key_sets)
    mass = {n: zeros(b, h, lq) for n in names}
    offsets = [int(o) for o in offsets]
    mass.update({f"offset{o:+d}": zeros(b, h, lq) for o in offsets})
    top_w = torch.full((b, h, lq, kk), -1.0, dtype=work, device=q.device)
    top_i = torch.zeros(b, h, lq, kk, dtype=torch.long, device=q.device)
    weights = zeros(b, len(heads_l), len(rows_l or []), lk) if heads_l is not None else None
    row_pos = {r: n for n, r in enumerate(rows_l or [])}
    if thumbnail < 0:
        raise ValueError(f"thumbnail must be >= 0 bins per side; got {thumbnail}")
    tq, tk = min(thumbnail, lq), min(thumbnail, lk)
    thumb = zeros(b, h, tq, tk) if thumbnail else None
    if thumbnail:  # one-hot bin membership of every row and key, and each bin's size
        bin_q = torch.nn.functional.one_hot(torch.arange(lq, device=q.device) * tq // max(lq, 1), tq).to(work)
        bin_k = torch.nn.functional.one_hot(torch.arange(lk, device=q.device) * tk // max(lk, 1), tk).to(work)
    neg = -torch.finfo(work).max / 4  # masked scores: exp() is 0 and 0 * neg is 0 (with -inf it would be NaN)
    keys = torch.arange(lk, device=q.device, dtype=work)
    for i0 in range(0, lq, block_q):  # pass 2: exact weights p = exp(s - lse), tile by tile, into the statistics
        i1 = min(i0 + block_q, lq)
        bq = i1 - i0
        lse_blk = lse[:, :, i0:i1, None]
        empty = torch.isinf(lse_blk)
        any_empty = bool(empty.any())
        safe = torch.where(empty, torch.zeros_like(lse_blk), lse_blk) if any_empty else lse_blk
        pos = torch.arange(i0, i1, device=q.device, dtype=work) + pos_offset  # (bq,) query positions among keys
        plogp = zeros(b, h, bq)
        local = [(n, r - i0) for r, n in row_pos.items() if i0 <= r < i1]
        cand_w, cand_i = [], []
        for j0 in range(0, lk, block_k):
            if tiles.skip(i0, bq, j0):
                break
            j1 = min(j0 + block_k, lk)
            x = tiles.scores(i0, i1, j0, j1, fill=neg)
            if x is None:
                continue
            x = x.sub_(safe)  # log p (neg where p = 0)
            if any_empty:
                x = x.masked_fill_(empty, neg)
            p = torch.exp(x)  # (b, h, bq, bk)
            plogp += torch.linalg.vecdot(p, x)
            received[:, :, j0:j1] += p.sum(-2)
            # the row reductions as one thin matmul: [sum p, sum p j, mass of each key set in this tile]
            sel = [n for n in names if bool(key_sets[n][:, j0:j1].any())]
            cols = torch.stack([torch.ones(j1 - j0, dtype=work, device=q.device), keys[j0:j1]], -1)  # (bk, 2)
            red = torch.matmul(p, cols)  # (b, h, bq, 2)
            for n in sel:
                mass[n][:, :, i0:i1] += torch.matmul(p, key_sets[n][:, None, j0:j1, None].to(work))[..., 0]
            if j1 - 1 <= pos[0]:  # every key at or before every query: |pos - j| = pos - j
                distance[:, :, i0:i1] += pos * red[..., 0] - red[..., 1]
            elif j0 >= pos[-1]:  # every key at or after every query
                distance[:, :, i0:i1] += red[..., 1] - pos * red[..., 0]
            else:  # the tile crosses the diagonal
                distance[:, :, i0:i1] += torch.matmul(
                    p[..., None, :], (pos[:, None] - keys[None, j0:j1]).abs()[..., None]
                )[..., 0, 0]
            for o in offsets:  # the weight on key pos(i) + o, for the rows whose key lies in this tile
                target = pos + o - j0  # (bq,)
                ok = (target >= 0) & (target < j1 - j0)
                if bool(ok.any()):
                    idx = target.clamp(0, j1 - j0 - 1).long()[None, None, :, None].expand(b, h, bq, 1)
                    mass[f"offset{o:+d}"][:, :, i0:i1] += p.gather(-1, idx)[..., 0] * ok.to(work)
            if kk:  # each tile's own top k, merged once per row block below
                w, ix = _tile_topk(p, kk)
                cand_w.append(w)
                cand_i.append(ix + j0)
            for slot, r in local:
                weights[:, :, slot, j0:j1] = p[:, heads_l, r]  # type: ignore[index]  # local is empty without weights
            if thumb is not None:  # (T, bq) @ (b, h, bq, bk) @ (bk, T)
                thumb += bin_q[i0:i1].T @ (p @ bin_k[j0:j1])
        entropy[:, :, i0:i1] = -plogp
        if kk and cand_w:
            w, ix = torch.cat(cand_w, -1), torch.cat(cand_i, -1)
            best, order = w.topk(min(kk, w.shape[-1]), dim=-1)
            top_w[:, :, i0:i1, : best.shape[-1]], top_i[:, :, i0:i1, : best.shape[-1]] = best, ix.gather(-1, order)
    if thumb is not None:
        thumb /= bin_q.sum(0)[:, None] * bin_k.sum(0)[None, :]  # sums -> means over each bin
    top_w = top_w.clamp_min(0)  # slots never filled (rows with fewer allowed keys than k) read 0
    return AttentionStats(
        lse=lse,
        entropy=entropy,
        received=received,
        distance=distance,
        mass=mass,
        topk_index=top_i if kk else None,
        topk_weight=top_w if kk else None,
        weights=weights,
        heads=heads_l,
        rows=rows_l,
        thumbnail=thumb,
        sink=sink,
    )


def map_stats(
    w: Tensor,
    *,
    offset: int | None = None,
    topk: int = 8,
    sets: dict | None = None,
    offsets=(),
    heads=None,
    rows=None,
    thumbnail: int = 0,
    **_tiles,
) -> AttentionStats:
    """The statistics of an explicit map ``w`` ``(B, H, Lq, Lk)`` that is not one softmax of ``q k^T`` per head:
    differential attention's ``A1 - lambda A2`` and talking heads' mixed weights, whose layers build the map anyway.
    ``received``, ``distance``, ``mass``, top-k, exact rows and the thumbnail are the same linear read-outs of ``w``
    as :func:`attention_stats` takes of a softmax; ``lse`` is ``log sum_j |w_ij|`` and ``entropy`` that of the row's
    normalised magnitudes ``|w_ij| / sum_j |w_ij|`` (both equal a softmax row's 0 and its entropy when ``w`` is
    one). Rows of zeros have ``lse = -inf`` and zero statistics. ``offset`` places query ``i`` at key ``i + offset``
    (default ``Lk - Lq``)."""
    if not isinstance(w, Tensor) or w.dim() != 4 or not w.is_floating_point():
        raise ValueError(
            f"map_stats takes a floating (B, H, Lq, Lk) map, got "
            f"{tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__}"
        )
    b, h, lq, lk = w.shape
    work = torch.promote_types(w.dtype, torch.float32)
    w = w.to(work)
    pos = torch.arange(lq, device=w.device, dtype=work) + (lk - lq if offset is None else offset)
    keys = torch.arange(lk, device=w.device, dtype=work)
    mag = w.abs()
    total = mag.sum(-1)
    lse = total.log()  # -inf for a row of zeros
    p = mag / total.clamp_min(torch.finfo(work).tiny)[..., None]
    entropy = -(p * p.clamp_min(torch.finfo(work).tiny).log()).sum(-1)
    mass = {n: (w * ks[:, None, None, :].to(work)).sum(-1) for n, ks in _key_sets(sets, b, lk, w.device).items()}
    for o in (int(o) for o in offsets):
        target = pos + o
        ok = (target >= 0) & (target < lk)
        idx = target.clamp(0, max(lk - 1, 0)).long()[None, None, :, None].expand(b, h, lq, 1)
        mass[f"offset{o:+d}"] = w.gather(-1, idx)[..., 0] * ok.to(work)
    kk = min(topk, lk)
    top_w, top_i = w.topk(kk, dim=-1) if kk else (None, None)
    heads_l, rows_l = _as_list(heads, h, "heads"), _as_list(rows, lq, "rows")
    if (heads_l is None) != (rows_l is None):
        heads_l = heads_l if heads_l is not None else list(range(h))
        rows_l = rows_l if rows_l is not None else list(range(lq))
    thumb = None
    if thumbnail:
        tq, tk = min(thumbnail, lq), min(thumbnail, lk)
        bin_q = torch.nn.functional.one_hot(torch.arange(lq, device=w.device) * tq // max(lq, 1), tq).to(work)
        bin_k = torch.nn.functional.one_hot(torch.arange(lk, device=w.device) * tk // max(lk, 1), tk).to(work)
        thumb = (bin_q.T @ w @ bin_k) / (bin_q.sum(0)[:, None] * bin_k.sum(0)[None, :])
    return AttentionStats(
        lse=lse,
        entropy=entropy,
        received=w.sum(-2),
        distance=(w * (pos[:, None] - keys[None, :]).abs()).sum(-1),
        mass=mass,
        topk_index=top_i,
        topk_weight=top_w,
        weights=w[:, heads_l][:, :, rows_l] if heads_l is not None else None,
        heads=heads_l,
        rows=rows_l,
        thumbnail=thumb,
    )


__all__ = ["AttentionStats", "attention_stats", "map_stats"]
