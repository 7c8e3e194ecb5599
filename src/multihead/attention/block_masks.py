"""FlexAttention block masks of a :class:`~multihead.attention.patterns.SparsePattern` in ``O(L / block)`` memory.

``create_block_mask(mask_mod, ...)`` without compilation evaluates ``mask_mod`` on every ``(query, key)`` pair to find
the non-empty tiles: ``O(L^2)`` memory (72 GiB at 64k tokens, measured on a GPU). A pattern's geometry says which key
tiles each query tile touches without looking at pairs:

* **window** (width ``w``, dilation ``d``): query tile ``[a, b)`` reaches keys ``[a - w d, b - 1 + w d]``; the tiles
  holding global tokens join every row, and query tiles holding a global token see every key tile;
* **block** (BigBird): the pattern's own ``(nb, nb)`` block layout, each query tile the union of its pattern rows.

Causal patterns drop the tiles past the diagonal. The result goes to ``BlockMask.from_kv_blocks`` with the pattern's
``mask_mod`` (index arithmetic, :meth:`AttnMask.mask_mod`), which decides the pairs inside the listed tiles. Index
data: ``(L / block)^2`` int32 slots (FlexAttention's layout), of which each row fills a few (all for global rows).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .patterns import SparsePattern

FLEX_BLOCK = 128  # FlexAttention's default tile


def kv_blocks(pattern: SparsePattern, length: int, *, causal: bool = False, block: int = FLEX_BLOCK
              ) -> tuple[Tensor, Tensor]:
    """``(kv_num_blocks (Qb,), kv_indices (Qb, KVb))`` int32 (the first ``kv_num_blocks[i]`` slots used): the key tiles each query tile of ``block`` positions
    may touch under ``pattern`` (a superset of the pairs it allows; the mask_mod decides inside the tiles)."""
    nb = -(-length // block)
    causal = causal or pattern.causal
    rows: list[Tensor] = []
    if pattern.kind == "window":
        reach = pattern.window * pattern.dilation
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
        pb = pattern.block
        layout = pattern.block_layout(-(-length // pb))  # (pattern blocks, pattern blocks) bool
        for i in range(nb):
            a, b = i * block, min((i + 1) * block, length)
            hit = layout[a // pb: (b - 1) // pb + 1].any(0).nonzero().flatten()  # pattern key blocks
            starts, ends = hit * pb // block, torch.clamp((hit + 1) * pb - 1, max=length - 1) // block
            tiles = torch.unique(torch.cat([torch.arange(s, e + 1) for s, e in zip(starts.tolist(), ends.tolist())])
                                 if len(hit) else torch.zeros(0, dtype=torch.long))
            if causal:
                tiles = tiles[tiles <= i]
            rows.append(tiles)
    # FlexAttention expects one index slot per key tile (its own masks are (Qb, KVb)): (L / block)^2 int32 -- 1 MiB
    # at 64k tokens -- against the L^2 of evaluating the mask on every pair
    num = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    idx = torch.zeros(nb, nb, dtype=torch.int32)
    for i, r in enumerate(rows):
        idx[i, :len(r)] = r.to(torch.int32)
    return num, idx


def pattern_block_mask(mask, length: int, device=None, *, block: int = FLEX_BLOCK):
    """The FlexAttention ``BlockMask`` of an :class:`AttnMask` whose structure is a pattern (plus causal and key
    padding, applied by its mask_mod inside the listed tiles), built from the pattern's geometry: no ``L x L``."""
    from torch.nn.attention.flex_attention import BlockMask

    num, idx = kv_blocks(mask.pattern, length, causal=mask.causal, block=block)
    return BlockMask.from_kv_blocks(num[None, None].to(device), idx[None, None].to(device), BLOCK_SIZE=block,
                                    mask_mod=mask.mask_mod(length, length, device), seq_lengths=(length, length))


__all__ = ["FLEX_BLOCK", "kv_blocks", "pattern_block_mask"]
