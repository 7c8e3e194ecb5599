"""Every backend on CUDA in bf16 and fp16 (skipped without a GPU): dense bool and float masks, key padding, causal at
an offset, sliding-window and BigBird patterns, GQA, forward and gradients, each against the fp64 formula on the same
device with the CPU matrix's budget (2x the error of the plain formula computed in the same low precision, plus one
rounding step of the output's size). Also: auto's CUDA routes run what explain_choice names, the memory-efficient
backend's CUDA route (compiled FlexAttention) returns the tile loop's lse and gradients, and the statistics' lse pass
on CUDA equals the CPU one."""

from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.attention import AttnMask, registry
from multihead.attention.patterns import SparsePattern

pytestmark = pytest.mark.gpu
DEV = "cuda"
L, D = 300, 64
MASKS = ["none", "bool", "float", "padding", "causal_offset", "window", "bigbird"]


def _mask(kind: str, gen):
    keep = torch.arange(L, device=DEV)[None, :] < torch.tensor([L, 123], device=DEV)[:, None]
    return {
        "none": None,
        "bool": torch.rand(2, 1, L, L, device=DEV, generator=gen) > 0.3,
        "float": torch.randn(1, 8, L, L, device=DEV, generator=gen),
        "padding": AttnMask(key_padding=keep),
        "causal_offset": AttnMask(causal=True, causal_offset=7),
        "window": AttnMask(pattern=SparsePattern(window=32, global_tokens=(0,)), key_padding=keep),
        "bigbird": SparsePattern(block=32, random_blocks=1, causal=True),
    }[kind]


def _allowed_bias(mask):
    """(allowed bool, float bias) broadcastable to (b, h, i, j), from any mask form."""
    if mask is None:
        return torch.ones(1, 1, L, L, dtype=torch.bool, device=DEV), None
    if isinstance(mask, SparsePattern):
        return mask.dense(L, DEV)[None, None], None
    if isinstance(mask, AttnMask):
        dense = mask.dense(L, L, DEV)
        return (dense.reshape(-1, 1, L, L) if dense.dim() < 4 else dense), None
    if mask.dtype == torch.bool:
        return mask, None
    return torch.ones(1, 1, L, L, dtype=torch.bool, device=DEV), mask


def _formula(q, k, v, allowed, bias, dtype):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    s = q @ k.transpose(-1, -2) / D**0.5
    if bias is not None:
        s = s + bias.to(dtype)
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0) @ v


def _backends():
    return sorted(n for n, b in mh.list_backends().items() if b.capabilities.exact)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("gqa", [False, True])
def test_every_capable_backend_within_budget_forward_and_backward(dtype, kind, gqa):
    gen = torch.Generator(device=DEV).manual_seed(hash((kind, gqa)) % 1000)
    g = 2 if gqa else 8
    q = torch.randn(2, 8, L, D, device=DEV, generator=gen)
    k, v = (torch.randn(2, g, L, D, device=DEV, generator=gen) for _ in range(2))
    mask = _mask(kind, gen)
    allowed, bias = _allowed_bias(mask)
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    ref = _formula(qd, kd, vd, allowed, bias, torch.float64)
    grad = torch.randn_like(ref)
    ref.backward(grad)
    ql, kl, vl = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
    plain = _formula(ql, kl, vl, allowed, bias, dtype)
    plain.backward(grad.to(dtype))
    plain_err = (plain.double() - ref).abs().max().item()
    plain_grads = [(t.grad.double() - r.grad).abs().max().item() for t, r in ((ql, qd), (kl, kd), (vl, vd))]
    eps = torch.finfo(dtype).eps
    ran = 0
    for name in _backends():
        b = mh.list_backends()[name]
        qb, kb, vb = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
        call = registry._call_info(qb, kb, AttnMask.of(mask), 0.0, False, True)
        if b.why_not(call) is not None:
            continue
        out, _ = mh.attention(qb, kb, vb, mask=mask, backend=name)
        err = (out.double() - ref).abs().max().item()
        assert torch.isfinite(out).all(), name
        assert err <= 2 * plain_err + 2 * eps * ref.abs().max().item(), (name, err, plain_err)
        out.backward(grad.to(dtype))
        for t, r, pe in zip((qb, kb, vb), (qd, kd, vd), plain_grads):
            gerr = (t.grad.double() - r.grad).abs().max().item()
            assert torch.isfinite(t.grad).all() and gerr <= 2 * pe + 4 * eps * r.grad.abs().max().item(), (name, gerr)
        ran += 1
    assert ran >= 2  # the reference and at least one fast path ran every case


@pytest.mark.parametrize(
    "mask,expected",
    [(SparsePattern(window=64), "flex"), (None, "sdpa"), (SparsePattern(block=64, causal=True), "flex")],
)
def test_auto_on_cuda_runs_what_explain_choice_names(mask, expected):
    if mh.list_backends()["flex"].available():
        pytest.skip("flex unavailable")
    q = torch.randn(1, 4, 1024, 64, device=DEV, dtype=torch.bfloat16)
    assert mh.explain_choice(q, q, mask=mask).startswith(f"auto runs {expected!r}")
    out, _ = mh.attention(q, q, q, mask=mask)
    ref, _ = mh.attention(q.double(), q.double(), q.double(), mask=mask, backend="reference")
    assert (out.double() - ref).abs().max().item() < 3e-2


@pytest.mark.parametrize("causal,offset", [(False, None), (True, None), (True, 40)])
def test_memory_efficient_cuda_route_equals_the_tile_loop_with_gradients(causal, offset):
    from multihead.attention.backends.memory_efficient import memory_efficient_attention

    gen = torch.Generator(device=DEV).manual_seed(3)
    q = torch.randn(2, 8, 200, 64, device=DEV, generator=gen)
    k, v = (torch.randn(2, 2, 260, 64, device=DEV, generator=gen) for _ in range(2))
    kw = dict(is_causal=causal, causal_offset=offset)
    a = [t.clone().requires_grad_(True) for t in (q, k, v)]
    b = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_t, lse_t = memory_efficient_attention(*a, kernel="tiles", **kw)
    out_f, lse_f = memory_efficient_attention(*b, **kw)  # auto on CUDA: compiled FlexAttention
    fin = torch.isfinite(lse_t)
    assert torch.equal(fin, torch.isfinite(lse_f)) and (lse_t[fin] - lse_f[fin]).abs().max() < 1e-4
    assert (out_t - out_f).abs().max() < 1e-4
    grad = torch.randn_like(out_t)
    out_t.backward(grad)
    out_f.backward(grad)
    for x, y in zip(a, b):
        assert (x.grad - y.grad).abs().max() < 1e-3


def test_statistics_lse_on_cuda_equals_cpu():
    from multihead.attention.stats import attention_stats

    q, k = (torch.randn(1, 4, 700, 32) for _ in range(2))
    mask = AttnMask(pattern=SparsePattern(window=50, global_tokens=(0,)))
    cpu = attention_stats(q, k, mask=mask, topk=4)
    gpu = attention_stats(q.to(DEV), k.to(DEV), mask=mask, topk=4)
    assert (cpu.lse - gpu.lse.cpu()).abs().max() < 1e-4
    assert (cpu.entropy - gpu.entropy.cpu()).abs().max() < 1e-4
