"""FlexAttention block masks of a :class:`~multihead.attention.patterns.SparsePattern` in ``O(L / block)`` memory.

``create_block_mask(mask_mod, ...)`` without compilation evaluates ``mask_mod`` on every ``(query, key)`` pair to find
the non-empty tiles: ``O(L^2)`` memory (72 GiB at 64k tokens, measured on a GPU). A pattern's geometry says which key
tiles each query tile touches without looking at pairs:

* **window** (width ``w``, dilation ``d``): query tile ``[a, b)`` reaches keys ``[a - w d, b - 1 + w d]``; the tiles
  holding global tokens join every row, and query tiles holding a global token see every key tile;
* **block** (BigBird): the pattern's own ``(nb, nb)`` block layout, each query tile the union of its pattern rows.

Causal patterns drop the tiles past the diagonal. Of the listed tiles, those the pattern allows entirely (inside
the band of a window without dilation, or covered by allowed blocks of a BigBird layout, and below the diagonal when
causal) are *full*: the kernel skips ``mask_mod`` there, as PyTorch's own compiled ``create_block_mask`` does; the
rest are *partial*. With key padding no tile is full (the padding is decided by ``mask_mod``, per key).
Both go to ``BlockMask.from_kv_blocks`` with the pattern's ``mask_mod`` (index arithmetic, :meth:`AttnMask.mask_mod`),
which decides the pairs inside the partial tiles. Index data: ``(L / block)^2`` int32 slots (FlexAttention's layout),
of which each row fills a few (all for global rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .patterns import SparsePattern

FLEX_BLOCK = 128  # FlexAttention's default tile


def kv_blocks(
    pattern: SparsePattern, length: int, *, causal: bool = False, block: int = FLEX_BLOCK
) -> tuple[Tensor, Tensor]:
    """``(kv_num_blocks (Qb,), kv_indices (Qb, KVb))`` int32 (the first ``kv_num_blocks[i]`` slots used): the key tiles each query tile of ``block`` positions
    may touch under ``pattern`` (a superset of the pairs it allows; the mask_mod decides inside the tiles)."""
    nb = -(-length // block)
    causal = causal or pattern.causal
    rows: list[Tensor] = []
    if pattern.kind == "window":
        reach = pattern.window_size * pattern.dilation
        g = sorted({t for t in pattern.global_tokens if 0 <= t < length})
        g_tiles = torch.tensor(sorted({t // block for t in g}), dtype=torch.long)
        for i in range(nb):
            a, b = i * block, min((i + 1) * block, length)
            if any(a <= t < b for t in g):  # a global query sees every key
                hi = nb - 1
                lo = 0
            else:
                lo, hi = max(0, a - reach) // block, min(length - 1, b - 1 + reach) // block
            if causal:
                hi = min(hi, i)
            tiles = torch.arange(lo, hi + 1)
            if len(g_tiles):
                extra = g_tiles[g_tiles <= i] if causal else g_tiles
                tiles = torch.unique(torch.cat([tiles, extra]))
            rows.append(tiles)
    else:
        pb = pattern.block_size
        layout = pattern.block_layout(-(-length // pb))  # (pattern blocks, pattern blocks) bool
        for i in range(nb):
            a, b = i * block, min((i + 1) * block, length)
            hit = layout[a // pb : (b - 1) // pb + 1].any(0).nonzero().flatten()  # pattern key blocks
            starts, ends = hit * pb // block, torch.clamp((hit + 1) * pb - 1, max=length - 1) // block
            tiles = torch.unique(
                torch.cat([torch.arange(s, e + 1) for s, e in zip(starts.tolist(), ends.tolist())])
                if len(hit)
                else torch.zeros(0, dtype=torch.long)
            )
            if causal:
                tiles = tiles[tiles <= i]
            rows.append(tiles)
    # FlexAttention expects one index slot per key tile (its own masks are (Qb, KVb)): (L / block)^2 int32 -- 1 MiB
    # at 64k tokens -- against the L^2 of evaluating the mask on every pair
    num = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    idx = torch.zeros(nb, nb, dtype=torch.int32)
    for i, r in enumerate(rows):
        idx[i, : len(r)] = r.to(torch.int32)
    return num, idx


def full_tiles(
    pattern: SparsePattern, length: int, num: Tensor, idx: Tensor, *, causal: bool = False, block: int = FLEX_BLOCK
) -> Tensor:
    """``(Qb, KVb)`` bool over the slots of :func:`kv_blocks`: True where the listed tile is allowed entirely (every
    query of the tile may attend every key of the tile), so the kernel need not evaluate ``mask_mod`` in it. A subset
    (never a superset) of the truly full tiles: global tokens and dilated windows make no tile full."""
    causal = causal or pattern.causal
    slots = torch.arange(idx.shape[1])
    used = slots[None, :] < num[:, None].long()  # (Qb, KVb)
    qi = torch.arange(idx.shape[0])[:, None].expand_as(idx)
    a, b = qi * block, torch.clamp((qi + 1) * block, max=length)  # query tile [a, b)
    c, e = idx.long() * block, torch.clamp((idx.long() + 1) * block, max=length)  # key tile [c, e)
    if pattern.kind == "window":
        if pattern.dilation != 1:
            return torch.zeros_like(used)
        full = torch.maximum(b - 1 - c, e - 1 - a) <= pattern.window_size  # the farthest pair is inside the band
    else:
        pb = pattern.block_size
        layout = pattern.block_layout(-(-length // pb))
        # a prefix-sum over the layout answers "is every pattern block in [r0..r1] x [c0..c1] allowed" per slot
        cum = torch.nn.functional.pad((~layout).int().cumsum(0).cumsum(1), (1, 0, 1, 0))
        r0, r1, c0, c1 = a // pb, (b - 1) // pb + 1, c // pb, (e - 1) // pb + 1
        holes = cum[r1, c1] - cum[r0, c1] - cum[r1, c0] + cum[r0, c0]
        full = holes == 0
    if causal:
        full &= e - 1 <= a  # every key at or before every query of the tile
    return full & used


def pattern_block_mask(mask, length: int, device=None, *, block: int = FLEX_BLOCK):
    """The FlexAttention ``BlockMask`` of an :class:`AttnMask` whose structure is a pattern (plus causal and key
    padding, applied by its mask_mod inside the partial tiles), built from the pattern's geometry: no ``L x L``."""
    num, idx = kv_blocks(mask.pattern, length, causal=mask.causal, block=block)
    listed = torch.arange(idx.shape[1])[None, :] < num[:, None].long()
    full = (
        full_tiles(mask.pattern, length, num, idx, causal=mask.causal, block=block)
        if mask.key_padding is None
        else torch.zeros_like(listed)
    )
    return _from_tiles(mask, idx, listed, full, length, length, device, block)


def causal_block_mask(mask, lq: int, lk: int, device=None, *, block: int = FLEX_BLOCK):
    """The ``BlockMask`` of a causal mask at any offset (query ``i`` sees keys ``j <= i + offset``; key padding, when
    present, decided by ``mask_mod`` in every listed tile): tiles past the diagonal are skipped, tiles entirely below
    it are full. From index arithmetic, ``O((L / block)^2)`` int32 -- never the ``Lq x Lk`` pairs."""
    off = mask.offset(lq, lk)
    nq, nk = -(-lq // block), -(-lk // block)
    a = torch.arange(nq)[:, None] * block  # first query of each tile
    last_q = torch.clamp(a + block, max=lq) - 1
    c = torch.arange(nk)[None, :] * block  # first key of each tile
    e = torch.clamp(c + block, max=lk)
    touched = c <= last_q + off  # some key of the tile is at or before the tile's last query
    full = (e - 1 <= a + off) & touched if mask.key_padding is None else torch.zeros_like(touched)
    idx = torch.arange(nk, dtype=torch.int32).expand(nq, nk).contiguous()
    return _from_tiles(mask, idx, touched, full, lq, lk, device, block)


def _from_tiles(mask, idx: Tensor, listed: Tensor, full: Tensor, lq: int, lk: int, device, block: int):
    """``BlockMask.from_kv_blocks`` from the slots of ``idx`` that are ``listed``, split into partial and ``full``
    tiles, with ``mask``'s mask_mod for the partial ones; one layout for every batch row and head."""
    from torch.nn.attention.flex_attention import BlockMask

    part_num, part_idx = _compact(idx, listed & ~full)
    full_num, full_idx = _compact(idx, full)
    put = lambda t: t[None, None].to(device)  # noqa: E731  (batch and head axes)
    return BlockMask.from_kv_blocks(
        put(part_num),
        put(part_idx),
        put(full_num),
        put(full_idx),
        BLOCK_SIZE=block,
        mask_mod=mask.mask_mod(lq, lk, device),
        seq_lengths=(lq, lk),
    )


def _compact(idx: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """The slots of ``idx`` where ``keep``, moved to the front of each row: ``(counts (Qb,), indices (Qb, KVb))``."""
    order = torch.argsort((~keep).int(), dim=1, stable=True)
    return keep.sum(1).to(torch.int32), torch.where(
        torch.gather(keep, 1, order), torch.gather(idx, 1, order), torch.zeros_like(idx)
    )


__all__ = ["FLEX_BLOCK", "causal_block_mask", "full_tiles", "kv_blocks", "pattern_block_mask"]
