"""Variants that take their parts from the kernel seam: ALiBi as one mask part per stack (densified once, swapped
for a pruned layer's own slopes; differential attention's half maps), learned sinks and ALiBi in MLA's two forms."""

import math

import pytest
import torch

from multihead.attention import AttnMask
from multihead.modules import MultiHeadLatentAttention
from multihead.modules.attention import alibi_slopes

from lm_helpers import randomise_sinks, small_lm, stepwise


def _softmax_formula(q, k, v, *, sinks, slopes):
    """Causal softmax with ALiBi and a sink logit in each denominator, written out (k, v shared by every head)."""
    lq = q.shape[2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    i, j = torch.arange(lq)[:, None], torch.arange(lq)[None, :]
    s = s - torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (i - j).abs()
    e = torch.exp(s).masked_fill(j > i, 0.0)
    return (e / (e.sum(-1, keepdim=True) + torch.exp(sinks)[None, :, None, None])) @ v


def test_a_stacks_alibi_mask_is_densified_once_for_every_layer(monkeypatch):
    lm = small_lm(3, "alibi", layers=4, backend="sdpa")
    calls = []
    real = AttnMask.alibi_bias
    monkeypatch.setattr(AttnMask, "alibi_bias", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    ids = torch.randint(1, 50, (2, 12))
    with torch.no_grad():
        full = lm(ids)
    assert len(calls) == 1  # four layers, one dense bias
    torch.testing.assert_close(stepwise(lm, ids, 5)[0], full, atol=1e-5, rtol=0)
    layer = lm.decoder.layers[1].self_attn  # a pruned layer swaps in its own slopes: pruned == masked
    with torch.no_grad():
        masked = lm(ids, head_mask=torch.tensor([[1.0] * 4, [1.0, 0.0, 1.0, 1.0], [1.0] * 4, [1.0] * 4]))
        layer.prune_heads([1])
        torch.testing.assert_close(lm(ids), masked, atol=1e-5, rtol=0)


def test_differential_attention_takes_alibi_on_both_half_maps():
    """Before, the ALiBi bias had H heads and the differential call 2H: any differential + ALiBi model failed."""
    lm = small_lm(4, "alibi", differential=True)
    ids = torch.randint(1, 50, (2, 10))
    with torch.no_grad():
        full = lm(ids)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(stepwise(lm, ids, 4)[0], full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("absorb", [False, True])
def test_mla_takes_alibi_and_sinks_from_the_seam_in_both_forms(absorb):
    torch.manual_seed(6)
    m = MultiHeadLatentAttention(32, 4, kv_latent=12, rope_dim=8, alibi=True, sinks=True).double()
    with torch.no_grad():
        m.sink_logits.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]))
    x = torch.randn(2, 9, 32, dtype=torch.float64, requires_grad=True)
    seen = {}
    m.hook_q.register_forward_hook(lambda mod, i, o: seen.__setitem__("q", o))
    m.hook_k.register_forward_hook(lambda mod, i, o: seen.__setitem__("k", o))
    m.hook_v.register_forward_hook(lambda mod, i, o: seen.__setitem__("v", o))
    out = m(x, is_causal=True, absorb=absorb)[0]
    q, k, v = seen["q"], seen["k"], seen["v"]
    scale_fix = math.sqrt(q.shape[-1]) / math.sqrt(m.head_dim + m.rope_dim)  # MLA scales by (d_h + d_r)^-1/2
    z = _softmax_formula(
        q * scale_fix,
        k.expand(-1, 4, -1, -1),
        v.expand(-1, 4, -1, -1),
        sinks=m.sink_logits,
        slopes=tuple(alibi_slopes(4).tolist()),
    )
    if absorb:
        z = torch.einsum("bhlc,hdc->bhld", z, m.w_uv.weight.view(4, 8, 12))
    want = z.transpose(1, 2).reshape(2, 9, 32) @ m.w_o.weight.T
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    g = torch.autograd.grad(out.square().sum(), m.sink_logits)[0]
    assert g.abs().min() > 0  # every head's sink learns through the seam


def test_an_mla_lm_with_alibi_and_sinks_decodes_through_its_latent_cache():
    lm = randomise_sinks(small_lm(7, "none", mla_latent=8, mla_rope_dim=4, alibi=True, sinks=True))
    ids = torch.randint(1, 50, (2, 11))
    with torch.no_grad():
        full = lm(ids)
    torch.testing.assert_close(stepwise(lm, ids, 4)[0], full, atol=1e-5, rtol=0)
