"""The parts a variant plugs into the kernel seam instead of the module: learned sinks as ``attention(...,
sinks=)`` (native on the reference backend, one exact extra key elsewhere) and ALiBi as a part of ``AttnMask`` (dense
once per stack, a ``score_mod`` for FlexAttention). Each against a formula written here, in fp64, with gradients."""

import math

import pytest
import torch

from multihead.attention import AttnMask, attention, explain
from multihead.attention.patterns import SparsePattern
from multihead.attention.stats import attention_stats
from multihead.attention.registry import get_backend
from multihead.modules.attention import alibi_slopes

EXACT = ["reference", "sdpa", "memory_efficient"]


def _inputs(seed, b=2, h=4, g=2, lq=7, lk=7, d=8):
    torch.manual_seed(seed)
    q = torch.randn(b, h, lq, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, g, lk, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, g, lk, d, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(b, lk, dtype=torch.bool)
    keep[1, lk - 2 :] = False
    return q, k, v, keep


def _formula(q, k, v, keep, *, offset=None, sinks=None, slopes=None):
    """softmax with the causal rule at ``offset``, key padding, ALiBi and a sink logit in the denominator."""
    h, lq, lk = q.shape[1], q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    off = lk - lq if offset is None else offset
    i, j = torch.arange(lq)[:, None] + off, torch.arange(lk)[None, :]
    if slopes is not None:
        s = s - torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (i - j).abs()
    allowed = (j <= i)[None, None] & keep[:, None, None, :]
    e = torch.exp(s).masked_fill(~allowed, 0.0)
    den = e.sum(-1, keepdim=True)
    if sinks is not None:
        den = den + torch.exp(sinks)[None, :, None, None]
    p = torch.where(den > 0, e / den, torch.zeros_like(e))
    return p @ v, p


@pytest.mark.parametrize("backend", EXACT + ["auto"])
@pytest.mark.parametrize("lq,lk", [(7, 7), (3, 7)])
def test_sinks_at_the_seam_equal_their_formula_with_gradients(backend, lq, lk):
    q, k, v, keep = _inputs(0, lq=lq, lk=lk)
    sinks = torch.tensor([-1.0, 0.5, 2.0, 4.0], dtype=torch.float64, requires_grad=True)
    am = AttnMask(key_padding=keep, causal=True)
    out, w = attention(q, k, v, mask=am, sinks=sinks, backend=backend, need_weights=backend == "reference")
    want, p = _formula(q, k, v, keep, sinks=sinks)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    for a, b in zip(
        torch.autograd.grad(out.square().sum(), [q, k, v, sinks]),
        torch.autograd.grad(want.square().sum(), [q, k, v, sinks]),
    ):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    if w is not None:  # the native path's weights: over the real keys, summing to 1 - the sink's share
        torch.testing.assert_close(w, p, atol=1e-10, rtol=0)


def test_sinks_are_a_declared_capability_and_a_sparse_kernel_says_why_not():
    assert get_backend("reference").capabilities.sinks and not get_backend("sdpa").capabilities.sinks
    q, k, v, _ = _inputs(1, g=4, lq=16, lk=16)
    reasons = dict(explain(q, k, mask=SparsePattern(window=2), sinks=True))
    assert "no sink key" in reasons["window"] and reasons["reference"] is None
    sinks = torch.zeros(4, dtype=torch.float64)
    out = attention(q, k, v, mask=SparsePattern(window=2), sinks=sinks)[0]  # auto: the dense reference
    allowed = (torch.arange(16)[:, None] - torch.arange(16)[None, :]).abs() <= 2
    s = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~allowed, -math.inf)
    e = torch.exp(s)
    want = (e / (e.sum(-1, keepdim=True) + 1.0)) @ v  # exp(0) = 1 in every denominator
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="one logit per query head"):
        attention(q, k, v, sinks=torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("backend", EXACT + ["auto"])
def test_alibi_as_a_mask_part_equals_its_formula_with_a_cache_offset(backend):
    q, k, v, keep = _inputs(2, lq=3, lk=7)
    slopes = tuple(alibi_slopes(4).tolist())
    am = AttnMask(key_padding=keep, causal=True, alibi=slopes)
    out = attention(q, k, v, mask=am, backend=backend)[0]
    want, _ = _formula(q, k, v, keep, slopes=slopes)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    both = attention(q, k, v, mask=am, backend=backend, sinks=torch.ones(4, dtype=torch.float64))[0]
    torch.testing.assert_close(
        both, _formula(q, k, v, keep, slopes=slopes, sinks=torch.ones(4, dtype=torch.float64))[0], atol=1e-10, rtol=0
    )
    with pytest.raises(ValueError, match="3 slopes but the call has 4 query heads"):
        attention(q, k, v, mask=AttnMask(alibi=slopes[:3]))


def test_alibi_score_mod_equals_the_dense_part():
    am = AttnMask(causal=True, alibi=(0.5, 0.125))
    dense = am.dense(5, 9)  # (1, 2, 5, 9) float, -inf where the causal rule forbids
    mod = am.score_mod(5, 9)
    b, h = torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.arange(2)[None, :, None, None]
    i, j = torch.arange(5)[None, None, :, None], torch.arange(9)[None, None, None, :]
    got = mod(torch.zeros(1, 2, 5, 9), b, h, i, j)
    allowed = ~torch.isinf(dense)
    torch.testing.assert_close(got[allowed.expand_as(got)], dense.expand_as(got)[allowed.expand_as(got)])


def test_stats_with_sinks_are_over_the_real_keys():
    """Before, the statistics of a layer with sinks counted the sink as key 0 (received, first-token mass, top-k)."""
    q, k, v, keep = _inputs(5, g=4, lq=7, lk=7)
    sinks = torch.tensor([-1.0, 0.5, 2.0, 4.0], dtype=torch.float64)
    st = attention_stats(q.detach(), k.detach(), key_padding_mask=keep, is_causal=True, sinks=sinks, topk=2)
    _, p = _formula(q.detach(), k.detach(), v, keep, sinks=sinks)
    torch.testing.assert_close(st.received, p.sum(-2), atol=1e-10, rtol=0)
    torch.testing.assert_close(st.mass["first"], p[..., 0], atol=1e-10, rtol=0)
    torch.testing.assert_close(st.sink, 1 - p.sum(-1), atol=1e-10, rtol=0)
    torch.testing.assert_close(st.topk_weight, p.topk(2, -1).values, atol=1e-10, rtol=0)
    plogp = torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
    torch.testing.assert_close(st.entropy, -plogp, atol=1e-10, rtol=0)
