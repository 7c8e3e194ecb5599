"""The memory-efficient backend across many tiles: outputs, gradients, lse, causal skipping, weights_for."""

import pytest
import torch

from multihead.attention import masks
from multihead.attention.backends.memory_efficient import memory_efficient_attention, weights_for
from multihead.attention.ops import expand_kv


def _ref(q, k, v, mask, is_causal):
    """Explicit softmax attention in the inputs' own dtype (fp64 here)."""
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if is_causal:
        s = s.masked_fill(~masks.causal_mask(q.shape[2], k.shape[2]), float("-inf"))
    w = torch.softmax(s, dim=-1)
    return w @ v, w


@pytest.mark.parametrize(
    "lq,lk,causal,mask_kind,g",
    [
        (50, 50, True, None, 4),
        (37, 61, True, None, 2),
        (61, 61, False, "bool", 4),
        (45, 70, False, "float", 1),
        (64, 64, False, "padding", 2),
    ],
)
def test_many_tiles_match_the_reference(lq, lk, causal, mask_kind, g):
    gen = torch.Generator().manual_seed(lq * lk)
    q = torch.randn(2, 4, lq, 24, generator=gen, dtype=torch.float64)
    k = torch.randn(2, g, lk, 24, generator=gen, dtype=torch.float64)
    v = torch.randn(2, g, lk, 24, generator=gen, dtype=torch.float64)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(2, 4, lq, lk, generator=gen) > 0.4
        mask[..., 3] = True
    elif mask_kind == "float":
        mask = torch.randn(1, 1, lq, lk, generator=gen, dtype=torch.float64)
        mask[..., 10:20] = float("-inf")
    elif mask_kind == "padding":
        mask = masks.key_padding_mask(torch.tensor([lk, 9]), lk)
    qs, ks, vs = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = memory_efficient_attention(qs, ks, vs, mask=mask, is_causal=causal, block_q=16, block_k=8)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref, w = _ref(qr, kr, vr, mask, causal)
    assert (out - ref).abs().max().item() < 1e-10
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    for a, b in ((qs, qr), (ks, kr), (vs, vr)):
        assert (a.grad - b.grad).abs().max().item() < 1e-10
    # lse is the log of the softmax normaliser: weights recovered from it equal the reference weights
    rows = torch.tensor([0, 5, lq - 1])
    part = weights_for(q, k, lse, heads=[1, 3], rows=rows, mask=mask, is_causal=causal)
    assert part.shape == (2, 2, 3, lk)
    assert (part - w[:, [1, 3]][:, :, rows]).abs().max().item() < 1e-10


def test_low_precision_is_accumulated_in_fp32():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 32, generator=gen) for _ in range(3))
    exact, _ = _ref(q.double(), k.double(), v.double(), None, True)
    out, _ = memory_efficient_attention(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True, block_q=64, block_k=64
    )
    naive, _ = _ref(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, True)
    assert out.dtype == torch.bfloat16
    assert (out.double() - exact).abs().max() <= (naive.double() - exact).abs().max()


@pytest.mark.parametrize(
    "lq,lk,causal,offset,mask_kind,g",
    [
        (50, 50, True, None, None, 4),
        (37, 61, True, None, None, 2),
        (20, 70, True, 10, None, 4),
        (61, 61, False, None, "bool", 4),
        (45, 70, False, None, "float", 1),
        (64, 64, True, None, "padding", 2),
    ],
)
def test_the_flex_route_gives_the_tile_loops_output_and_lse(lq, lk, causal, offset, mask_kind, g):
    """The CUDA route (FlexAttention with lse; checked here through its eager reference on CPU) computes what the
    readable tile loop computes, lse included: bool, float and padding masks, causal at an offset (a query row with
    no key at all among them), GQA. Gradients of the route are FlexAttention's own (CUDA; tests/attention/test_gpu)."""
    gen = torch.Generator().manual_seed(lq + lk)
    q = torch.randn(2, 4, lq, 16, generator=gen)
    k, v = (torch.randn(2, g, lk, 16, generator=gen) for _ in range(2))
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(2, 4, lq, lk, generator=gen) > 0.4
        mask[1, :, 5] = False  # a row with nothing to attend
    elif mask_kind == "float":
        mask = torch.randn(1, 1, lq, lk, generator=gen)
    elif mask_kind == "padding":
        mask = masks.key_padding_mask(torch.tensor([lk, 9]), lk)
    kw = dict(mask=mask, is_causal=causal, causal_offset=offset)
    with torch.no_grad():
        ref, ref_lse = memory_efficient_attention(q, k, v, kernel="tiles", block_q=16, block_k=16, **kw)
        out, lse = memory_efficient_attention(q, k, v, kernel="flex", **kw)
    assert lse.shape == ref_lse.shape == (2, 4, lq, 1)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-5
    assert (out - ref).abs().max().item() < 1e-5
    if mask_kind == "bool":
        assert bool(torch.isinf(lse[1, :, 5]).all()) and bool((out[1, :, 5] == 0).all())


def test_the_flex_route_refuses_gradients_on_cpu_and_unknown_kernels():
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    with pytest.raises(ValueError, match="no backward on CPU"):
        memory_efficient_attention(q, q, q, kernel="flex")
    with pytest.raises(ValueError, match="kernel must be one of"):
        memory_efficient_attention(q, q, q, kernel="triton")
    out, _ = memory_efficient_attention(q, q, q)  # auto on CPU: the tile loop, with its backward
    out.sum().backward()
    assert q.grad is not None
