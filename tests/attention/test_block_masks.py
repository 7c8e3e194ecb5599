"""Block masks from a pattern's geometry: every allowed pair lies in a listed tile (nothing lost), the tiles plus
the mask_mod equal pattern.dense(L), and at 64k tokens building one takes index data, not L x L."""
import pytest
import torch

from multihead.attention import AttnMask
from multihead.attention.block_masks import kv_blocks, pattern_block_mask
from multihead.attention.patterns import SparsePattern

PATTERNS = [SparsePattern(window=5), SparsePattern(window=3, dilation=2, global_tokens=(0, 70)),
            SparsePattern(window=4, causal=True), SparsePattern(window=2, global_tokens=(90,), causal=True),
            SparsePattern(block=8, random_blocks=1), SparsePattern(block=16, causal=True),
            SparsePattern(block=24, window_blocks=0, global_blocks=1)]


@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
@pytest.mark.parametrize("length,block", [(100, 16), (133, 32), (64, 64)])
def test_listed_tiles_cover_the_pattern_and_no_more_than_needed(pattern, length, block):
    num, idx = kv_blocks(pattern, length, block=block)
    nb = -(-length // block)
    listed = torch.zeros(nb, nb, dtype=torch.bool)
    for i in range(nb):
        listed[i, idx[i, :num[i]].long()] = True
    dense = pattern.dense(length)
    tiles = torch.zeros(nb, nb, dtype=torch.bool)  # the tiles holding at least one allowed pair
    for i in range(nb):
        for j in range(nb):
            tiles[i, j] = dense[i * block:(i + 1) * block, j * block:(j + 1) * block].any()
    assert bool((tiles & ~listed).sum() == 0)  # nothing lost
    if pattern.kind == "block" or not pattern.global_tokens:
        assert torch.equal(listed, tiles)  # and no empty tile listed


@pytest.mark.parametrize("pattern", PATTERNS[:4] + PATTERNS[5:6], ids=str)
def test_block_mask_with_its_mask_mod_equals_the_dense_pattern(pattern):
    length, block = 96, 16
    bm = pattern_block_mask(AttnMask(pattern=pattern), length, block=block)
    blocks = bm.to_dense()[0, 0].bool()  # (Qb, KVb)
    expanded = blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)[:length, :length]
    i = torch.arange(length)
    inside = bm.mask_mod(torch.tensor(0), torch.tensor(0), i[:, None], i[None, :])
    assert torch.equal(expanded & inside, pattern.dense(length))


def test_building_the_block_mask_at_64k_takes_index_data_not_l_squared():
    from multihead.bench.harness import measure

    length = 65536
    pattern = SparsePattern(window=256, global_tokens=(0,))
    r = measure(lambda: kv_blocks(pattern, length), min_repeats=1, min_time=0)
    num, idx = kv_blocks(pattern, length)
    assert idx.numel() * 4 <= 2**20  # the index data: 512 x 512 int32 slots (FlexAttention's layout)
    if r["peak_mb"] is not None:
        assert r["peak_mb"] < 64  # a dense bool map alone would be 4 GiB
    assert int(num[5]) == 1 + 5  # a middle row: its band (5 tiles at 128 with reach 256) and the global tile
