"""The reliability fixes on CUDA (skipped without a GPU): flex takes every documented mask shape and causal
Lq != Lk, and is exact at the lengths where the CPU kernel is wrong; empty sequences give zeros on the device."""

from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.attention.masks import causal_mask

pytestmark = pytest.mark.gpu


def _formula(q, k, v, allowed):
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("length", [8, 24, 200, 256])
def test_flex_on_cuda_every_mask_shape_and_odd_lengths(dtype, tol, length):
    flex = mh.list_backends()["flex"]
    if flex.available():
        pytest.skip(flex.available())
    gen = torch.Generator(device="cuda").manual_seed(length)
    q, k, v = (torch.randn(2, 2, length, 64, device="cuda", generator=gen, dtype=dtype) for _ in range(3))
    m = torch.rand(2, length, length, device="cuda", generator=gen) > 0.3
    for mask in (None, m[0], m, m[:, None]):
        with torch.no_grad():
            out, _ = mh.attention(q, k, v, mask=mask, backend="flex")
        allowed = torch.ones(2, 2, length, length, dtype=torch.bool, device="cuda")
        if mask is not None:
            allowed = allowed & mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        assert (out.double() - _formula(q, k, v, allowed)).abs().max() < tol, (
            length,
            None if mask is None else mask.dim(),
        )
    kk, vv = (torch.randn(2, 2, 2 * length, 64, device="cuda", generator=gen, dtype=dtype) for _ in range(2))
    with torch.no_grad():
        out, _ = mh.attention(q, kk, vv, is_causal=True, backend="flex")
    allowed = causal_mask(length, 2 * length, device="cuda")[None, None].expand(2, 2, length, 2 * length)
    assert (out.double() - _formula(q, kk, vv, allowed)).abs().max() < tol


@pytest.mark.parametrize("backend", ["sdpa", "reference", "memory_efficient", "performer"])
def test_empty_sequences_on_cuda(backend):
    q = torch.randn(1, 2, 4, 16, device="cuda", requires_grad=True)
    k = torch.randn(1, 2, 0, 16, device="cuda")
    out, _ = mh.attention(q, k, k, backend=backend)
    assert out.shape == (1, 2, 4, 16) and out.device.type == "cuda" and not out.abs().sum()
