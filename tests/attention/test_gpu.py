"""CUDA checks (skipped without a GPU): backends in bf16 against an fp64 reference on the same device, with the
same budget as the CPU matrix (2x the error of the plain formula computed in bf16, plus bf16 rounding)."""

import pytest
import torch

import multihead as mh


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_cuda_bf16_within_budget(backend):
    dev = "cuda"
    q, k, v = (torch.randn(2, 8, 333, 64, device=dev) for _ in range(3))
    mask = torch.rand(2, 1, 333, 333, device=dev) > 0.2
    mask[1, :, 7] = False  # a fully masked row
    ref, _ = mh.attention(q.double(), k.double(), v.double(), mask=mask, backend="reference")
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    scores = (qb @ kb.transpose(-2, -1) / 8).masked_fill(~mask, float("-inf"))
    plain = torch.softmax(scores, -1).nan_to_num(0) @ vb  # PyTorch's formula in bf16
    out, _ = mh.attention(qb, kb, vb, mask=mask, backend=backend)
    assert torch.isfinite(out).all() and (out[1, :, 7] == 0).all()
    ok = mask.any(-1).expand(2, 8, 333)
    err = (out.double() - ref)[ok].abs().max().item()
    pt_err = (plain.double() - ref)[ok].abs().max().item()
    assert err <= 2 * pt_err + 2 * torch.finfo(torch.bfloat16).eps * ref.abs().max().item()
