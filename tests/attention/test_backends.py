"""Every backend against an fp64 reference, outputs and gradients, error bounded relative to PyTorch's own error.

Following flash-attention's tests: the plain PyTorch formula computed *in the test dtype* sets the error budget; a
backend may be at most 2x as far from the fp64 truth on outputs (3x on gradients), plus twice the dtype's rounding
step at the output's magnitude.
"""

import itertools
import zlib

import pytest
import torch

import multihead as mh
from multihead.attention import masks

# exact backends that take dense masks (sparse-pattern and approximate backends have their own tests)
# (flex has no CPU backward: tests/attention/test_flex.py covers its forward)
BACKENDS = sorted(
    n
    for n, b in mh.list_backends().items()
    if b.capabilities.exact and not b.capabilities.requires_pattern and "cpu" in b.capabilities.backward_devices
)
DTYPES = [torch.float32, torch.bfloat16]
HEAD_DIMS = [16, 59]
LENGTHS = [1, 7, 97, 256]
MASKS = ["none", "padding", "causal_kv", "causal_long_q", "arbitrary", "fully_masked"]
B, H = 2, 4


def make_case(mask_kind, L, head_dim, gqa, dtype, generator):
    lq, lk = L, L
    if mask_kind == "causal_kv":  # KV cache: queries are the last Lq of Lk positions
        lk = L + 5
    if mask_kind == "causal_long_q":  # more queries than keys: first rows have no key at all
        lq = L + 5
    hkv = 2 if gqa else H
    q = torch.randn(B, H, lq, head_dim, generator=generator, dtype=torch.float64)
    k = torch.randn(B, hkv, lk, head_dim, generator=generator, dtype=torch.float64)
    v = torch.randn(B, hkv, lk, head_dim, generator=generator, dtype=torch.float64)
    mask, is_causal = None, False
    if mask_kind == "padding":
        lengths = torch.tensor([lk, max(1, lk // 2)])
        mask = masks.key_padding_mask(lengths, lk)  # (B, 1, 1, Lk)
    elif mask_kind in ("causal_kv", "causal_long_q"):
        is_causal = True
    elif mask_kind == "arbitrary":
        mask = torch.rand(B, H, lq, lk, generator=generator) > 0.3
        mask[..., 0] = True  # every row keeps at least one key
    elif mask_kind == "fully_masked":
        mask = torch.rand(B, 1, lq, lk, generator=generator) > 0.5
        mask[0, :, 0] = False  # query 0 of batch 0 sees nothing
        mask[1] = False  # every query of batch 1 sees nothing
    return [t.to(dtype) for t in (q, k, v)], mask, is_causal


def plain(q, k, v, mask, is_causal):
    """The tutorial's formula in the tensors' own dtype (PyTorch's error budget), NaN rows -> 0."""
    h = q.shape[1]
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    if is_causal:
        allowed = allowed & masks.causal_mask(q.shape[2], k.shape[2])
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return w @ v, allowed.any(-1)  # (B, H, Lq, D), (B, H, Lq)


def run_with_grads(fn, q, k, v, grad_out):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad_out.to(out.dtype))
    return out.detach().double(), [t.grad.double() for t in (q, k, v)]


def rounding_step(x: torch.Tensor, dtype) -> float:
    """The dtype's spacing at the largest magnitude in ``x`` (its unit of rounding error there)."""
    return torch.finfo(dtype).eps * float(x.abs().max())


CASES = list(itertools.product(BACKENDS, DTYPES, HEAD_DIMS, LENGTHS, MASKS, [False, True]))


@pytest.mark.parametrize(
    "backend,dtype,head_dim,L,mask_kind,gqa",
    CASES,
    ids=[f"{b}-{str(dt)[6:]}-d{d}-L{L}-{m}-{'gqa' if g else 'mha'}" for b, dt, d, L, m, g in CASES],
)
def test_backend_matches_fp64_reference(backend, dtype, head_dim, L, mask_kind, gqa):
    # a stable seed per case (Python's hash() of a str changes with every process: the data would too)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}-{head_dim}-{L}-{mask_kind}-{gqa}".encode()))
    (q, k, v), mask, is_causal = make_case(mask_kind, L, head_dim, gqa, dtype, gen)
    grad_out = torch.randn(q.shape[:3] + (v.shape[-1],), generator=gen, dtype=torch.float64)

    ref_out, ref_grads = run_with_grads(
        lambda a, b, c: plain(a, b, c, mask, is_causal)[0], q.double(), k.double(), v.double(), grad_out
    )
    pt_out, pt_grads = run_with_grads(lambda a, b, c: plain(a, b, c, mask, is_causal)[0], q, k, v, grad_out)
    out, grads = run_with_grads(
        lambda a, b, c: mh.attention(a, b, c, mask=mask, is_causal=is_causal, backend=backend)[0], q, k, v, grad_out
    )
    _, row_ok = plain(q.double(), k.double(), v.double(), mask, is_causal)
    empty = ~row_ok  # (B, H, Lq): rows with no allowed key

    assert torch.isfinite(out).all(), "output has NaN/inf"
    assert (out[empty] == 0).all(), "fully masked query rows must output exact zeros"
    atol = 2 * rounding_step(ref_out, dtype)
    err = (out - ref_out)[row_ok].abs().max().item() if row_ok.any() else 0.0
    pt_err = (pt_out - ref_out)[row_ok].abs().max().item() if row_ok.any() else 0.0
    assert err <= 2 * pt_err + atol, f"output error {err:.3g} > 2 x PyTorch's {pt_err:.3g} + {atol:.3g}"

    # Rounding step at the magnitude of the terms the gradients are summed from: dq and dk come from
    # dS = P * (dP - rowsum(P * dP)) with dP = dO V^T, which cancels exactly (to 0) when a row sees one key.
    dp = grad_out @ v.double().repeat_interleave(H // v.shape[1], dim=1).transpose(-2, -1)  # (B, H, Lq, Lk)
    cancel = dp.abs().max() * max(q.double().abs().max(), k.double().abs().max()) / head_dim**0.5
    g_atol = 2 * rounding_step(torch.stack([g.abs().max() for g in ref_grads] + [cancel]), dtype)
    for name, g, g_ref, g_pt in zip("qkv", grads, ref_grads, pt_grads):
        assert torch.isfinite(g).all(), f"d{name} has NaN/inf"
        g_err = (g - g_ref).abs().max().item()
        g_pt_err = (g_pt - g_ref).abs().max().item()
        assert g_err <= 3 * g_pt_err + g_atol, (
            f"d{name} error {g_err:.3g} > 3 x PyTorch's {g_pt_err:.3g} + {g_atol:.3g}"
        )
    assert (grads[0][empty] == 0).all(), "fully masked query rows must get zero dq"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fully_masked_rows_float_bias_no_nan(backend, dtype):
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    bias = torch.zeros(1, 1, 4, 4, dtype=dtype)
    bias[..., 1, :] = float("-inf")  # -inf bias: row 1 fully masked
    bias[..., 2, :] = torch.finfo(dtype).min  # HF-style most-negative fill: row 2 fully masked
    bias[..., 3, :2] = float("-inf")
    out, _ = mh.attention(q, k, v, mask=bias, backend=backend)
    out.float().sum().backward()
    assert torch.isfinite(out).all()
    assert (out[:, :, 1:3] == 0).all()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_reference_weights_sum_to_one_and_zero_rows():
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1, :, 2] = False
    _, w = mh.attention(q, k, v, mask=mask, need_weights=True)
    assert w.shape == (2, 3, 5, 5)
    sums = w.sum(-1)
    assert torch.allclose(sums[0], torch.ones_like(sums[0]))
    assert (sums[1, :, 2] == 0).all() and torch.allclose(sums[1, :, [0, 1, 3, 4]], torch.ones(3, 4))


def test_additive_float_mask_equals_bool_mask():
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    keep = torch.rand(2, 2, 6, 6) > 0.4
    keep[..., 0] = True
    bias = torch.zeros(2, 2, 6, 6).masked_fill(~keep, float("-inf"))
    for backend in BACKENDS:
        a, _ = mh.attention(q, k, v, mask=keep, backend=backend)
        b, _ = mh.attention(q, k, v, mask=bias, backend=backend)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_matches_torch_sdpa_square_causal():
    q, k, v = (torch.randn(2, 4, 33, 16) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for backend in BACKENDS:
        out, _ = mh.attention(q, k, v, is_causal=True, backend=backend)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_float_bias_in_another_dtype_than_the_queries_gives_the_same_answer_on_sdpa():
    # an fp32 ALiBi bias with -inf padding and fp64 queries: PyTorch's CPU kernel alone gets such rows wrong
    from multihead.attention import AttnMask, attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 6, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    mask = AttnMask(key_padding=keep, alibi=(0.25, 0.0625, 0.0156, 0.0039))
    bias = mask.dense(9, 9).double()
    want = torch.softmax(q @ k.transpose(-2, -1) / 6**0.5 + bias, -1) @ v
    out = attention(q, k, v, mask=mask, backend="sdpa")
    torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, want, atol=1e-12, rtol=0)
