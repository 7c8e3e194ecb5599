"""FlexAttention backend: equals the reference under our masks, where torch.compile works (slow first compile)."""

import pytest
import torch

import multihead as mh
from multihead.attention import AttnMask
from multihead.attention.patterns import SparsePattern

flex = mh.list_backends()["flex"]
pytestmark = pytest.mark.skipif(flex.available() is not None, reason=f"flex unavailable: {flex.available()}")


def test_flex_equals_reference_for_masks_and_patterns():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 16, generator=gen) for _ in range(3))
    keep = torch.arange(128)[None, :] < torch.tensor([128, 77])[:, None]
    cases = [
        (None, True),
        (keep[:, None, None, :], False),
        (AttnMask(pattern=SparsePattern(window=9, global_tokens=(0,)), key_padding=keep), False),
        (SparsePattern(block=16, random_blocks=1, causal=True), False),
        (SparsePattern(window=130), False),  # one full tile: the kernel skips mask_mod there
        (AttnMask(key_padding=keep, causal=True, alibi=[0.5, 0.25, 0.125, 0.0625]), False),  # ALiBi: a score_mod
    ]
    with torch.no_grad():
        for mask, causal in cases:
            dense = (
                mask.dense(128)
                if isinstance(mask, SparsePattern)
                else mask.dense(128, 128)
                if isinstance(mask, AttnMask)
                else mask
            )
            out, _ = mh.attention(q, k, v, mask=mask, is_causal=causal, backend="flex")
            ref, _ = mh.attention(q, k, v, mask=dense, is_causal=causal, backend="reference")
            assert (out - ref).abs().max().item() < 1e-5, (mask if not torch.is_tensor(mask) else "tensor", causal)


def test_flex_is_skipped_when_gradients_are_needed_on_cpu():
    q = torch.randn(1, 2, 64, 8, requires_grad=True)
    reason = dict(mh.explain(q, q))["flex"]
    assert reason == "has no backward on cpu (inputs require grad)"
    with pytest.raises(ValueError, match="no backward on cpu"):
        mh.attention(q, q, q, backend="flex")


def test_flex_runs_every_part_natively_and_empty_rows_are_zero():
    """Key padding (with a sequence that has no real key), causal at an offset (a static KV cache) and a bool tensor
    all go to FlexAttention as one mask_mod; rows with no key are zero, as on every other backend."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 16, 16, generator=gen)
    k, v = (torch.randn(2, 4, 128, 16, generator=gen) for _ in range(2))
    keep = torch.ones(2, 128, dtype=torch.bool)
    keep[1] = False  # batch 1: nothing to attend
    extra = torch.rand(1, 1, 16, 128, generator=gen) > 0.2
    mask = AttnMask(key_padding=keep, causal=True, causal_offset=40, tensor=extra)
    assert dict(mh.explain(q, k, mask=mask))["flex"] is None
    with torch.no_grad():
        out, _ = mh.attention(q, k, v, mask=mask, backend="flex")
        ref, _ = mh.attention(q, k, v, mask=mask.dense(16, 128), backend="reference")
    assert (out - ref).abs().max().item() < 1e-5 and torch.all(out[1] == 0)


def test_causal_block_masks_from_geometry_at_offsets_and_with_padding():
    """Causal masks go to FlexAttention as a block mask from index arithmetic (tiles past the diagonal skipped, tiles
    below it full): square, a KV cache's offset (Lq < Lk), and with key padding (no full tiles: mask_mod decides)."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 16, 16, generator=gen)
    k, v = (torch.randn(2, 4, 256, 16, generator=gen) for _ in range(2))
    keep = torch.arange(256)[None, :] < torch.tensor([256, 140])[:, None]
    qs = torch.randn(2, 4, 256, 16, generator=gen)
    cases = [
        (qs, AttnMask(causal=True)),
        (qs, AttnMask(causal=True, key_padding=keep)),
        (q, AttnMask(causal=True)),
        (q, AttnMask(causal=True, causal_offset=100, key_padding=keep)),
    ]
    with torch.no_grad():
        for query, mask in cases:
            lq = query.shape[2]
            out, _ = mh.attention(query, k, v, mask=mask, backend="flex")
            ref, _ = mh.attention(query, k, v, mask=mask.dense(lq, 256), backend="reference")
            assert (out - ref).abs().max().item() < 1e-5, mask
