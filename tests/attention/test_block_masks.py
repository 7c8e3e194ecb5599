"""Block masks from a pattern's geometry: every allowed pair lies in a listed tile (nothing lost), the tiles plus
the mask_mod equal pattern.dense(L), and at 64k tokens building one takes index data, not L x L."""

import pytest
import torch

from multihead.attention import AttnMask
from multihead.attention.block_masks import full_tiles, kv_blocks, pattern_block_mask
from multihead.attention.patterns import SparsePattern

PATTERNS = [
    SparsePattern(window=5),
    SparsePattern(window=3, dilation=2, global_tokens=(0, 70)),
    SparsePattern(window=4, causal=True),
    SparsePattern(window=2, global_tokens=(90,), causal=True),
    SparsePattern(block=8, random_blocks=1),
    SparsePattern(block=16, causal=True),
    SparsePattern(block=24, window_blocks=0, global_blocks=1),
]


@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
@pytest.mark.parametrize("length,block", [(100, 16), (133, 32), (64, 64)])
def test_listed_tiles_cover_the_pattern_and_no_more_than_needed(pattern, length, block):
    num, idx = kv_blocks(pattern, length, block=block)
    nb = -(-length // block)
    listed = torch.zeros(nb, nb, dtype=torch.bool)
    for i in range(nb):
        listed[i, idx[i, : num[i]].long()] = True
    dense = pattern.dense(length)
    tiles = torch.zeros(nb, nb, dtype=torch.bool)  # the tiles holding at least one allowed pair
    for i in range(nb):
        for j in range(nb):
            tiles[i, j] = dense[i * block : (i + 1) * block, j * block : (j + 1) * block].any()
    assert bool((tiles & ~listed).sum() == 0)  # nothing lost
    if pattern.kind == "block" or not pattern.global_tokens:
        assert torch.equal(listed, tiles)  # and no empty tile listed


FULL_CASES = PATTERNS + [
    SparsePattern(window=40),
    SparsePattern(window=40, causal=True),
    SparsePattern(block=32, window_blocks=2, global_blocks=2),
]


@pytest.mark.parametrize("pattern", FULL_CASES, ids=str)
@pytest.mark.parametrize("length,block", [(100, 16), (133, 32), (256, 16)])
def test_full_tiles_are_allowed_entirely_and_found_where_the_geometry_allows(pattern, length, block):
    """A tile marked full lets the kernel skip mask_mod, so every pair in it must be allowed; for windows without
    dilation or global tokens, and for BigBird layouts, every truly full tile is found."""
    num, idx = kv_blocks(pattern, length, block=block)
    full = full_tiles(pattern, length, num, idx, block=block)
    dense = pattern.dense(length)
    truly = 0
    for i in range(len(num)):
        for slot in range(int(num[i])):
            j = int(idx[i, slot])
            tile = dense[i * block : (i + 1) * block, j * block : (j + 1) * block]
            assert not full[i, slot] or bool(tile.all()), (i, j)
            truly += int(bool(tile.all()))
    assert not full[torch.arange(idx.shape[1])[None, :] >= num[:, None]].any()  # unused slots never full
    if pattern.kind == "block" or (pattern.dilation == 1 and not pattern.global_tokens):
        assert int(full.sum()) == truly


@pytest.mark.parametrize("pattern", FULL_CASES[:4] + FULL_CASES[5:6] + FULL_CASES[7:], ids=str)
def test_block_mask_with_its_mask_mod_equals_the_dense_pattern(pattern):
    """What FlexAttention computes: full tiles entirely, partial tiles through mask_mod."""
    length, block = 96, 16
    bm = pattern_block_mask(AttnMask(pattern=pattern), length, block=block)
    i = torch.arange(length)

    def expand(num, idx):
        tiles = torch.zeros(len(num[0, 0]), idx.shape[-1], dtype=torch.bool)
        for r in range(len(tiles)):
            tiles[r, idx[0, 0, r, : num[0, 0, r]].long()] = True
        return tiles.repeat_interleave(block, 0).repeat_interleave(block, 1)[:length, :length]

    partial = expand(bm.kv_num_blocks, bm.kv_indices)
    full = expand(bm.full_kv_num_blocks, bm.full_kv_indices)
    inside = bm.mask_mod(torch.tensor(0), torch.tensor(0), i[:, None], i[None, :])
    assert not (partial & full).any()
    assert torch.equal(full | (partial & inside), pattern.dense(length))
    if pattern.kind == "window" and pattern.window == 40:
        assert full.any()  # the wide band has full tiles; with key padding none are (mask_mod decides padding)
        keep = torch.ones(1, length, dtype=torch.bool)
        assert (
            pattern_block_mask(
                AttnMask(pattern=pattern, key_padding=keep), length, block=block
            ).full_kv_num_blocks.sum()
            == 0
        )


def test_building_the_block_mask_at_64k_takes_index_data_not_l_squared():
    from multihead.bench.harness import measure

    length = 65536
    pattern = SparsePattern(window=256, global_tokens=(0,))
    r = measure(lambda: kv_blocks(pattern, length), min_repeats=1, min_time=0)
    num, idx = kv_blocks(pattern, length)
    assert idx.numel() * 4 <= 2**20  # the index data: 512 x 512 int32 slots (FlexAttention's layout)
    if r["peak_mb"] is not None:
        assert r["peak_mb"] < 64  # a dense bool map alone would be 4 GiB
    full = full_tiles(pattern, length, num, idx)
    # of those, tiles 4, 5 and 6 are inside the band entirely (farthest pair 255 <= 256); 3, 7 and the global not
    assert [int(t) for t in idx[5][full[5]]] == [4, 5, 6]
    assert int(num[5]) == 1 + 5  # a middle row: its band (5 tiles at 128 with reach 256) and the global tile


@pytest.mark.parametrize(
    "mask",
    [
        AttnMask(pattern=SparsePattern(window=256, global_tokens=(0,))),
        AttnMask(pattern=SparsePattern(block=64, random_blocks=1)),
        AttnMask(causal=True),
    ],
    ids=["window", "bigbird", "causal"],
)
def test_the_whole_block_mask_at_64k_holds_index_data_only(mask):
    """FlexAttention's BlockMask at 64k (partial and full tiles, and the transposed indices it derives for the
    backward): a few MiB of int32 indices, built within tens of MiB -- create_block_mask evaluated 2^32 pairs."""
    from multihead.attention.block_masks import causal_block_mask
    from multihead.bench.harness import measure

    length = 65536
    build = (
        (lambda: causal_block_mask(mask, length, length))
        if mask.pattern is None
        else (lambda: pattern_block_mask(mask, length))
    )
    r = measure(build, min_repeats=1, min_time=0)
    bm = build()
    held = sum(
        t.numel() * t.element_size()
        for t in (
            bm.kv_num_blocks,
            bm.kv_indices,
            bm.full_kv_num_blocks,
            bm.full_kv_indices,
            bm.q_num_blocks,
            bm.q_indices,
            bm.full_q_num_blocks,
            bm.full_q_indices,
        )
        if t is not None
    )
    assert held <= 4 * 2**20 + 4 * 512 * 4  # four (512, 512) int32 index tables and their counts
    if r["peak_mb"] is not None:
        assert r["peak_mb"] < 64  # the dense bool map alone would be 4 GiB
