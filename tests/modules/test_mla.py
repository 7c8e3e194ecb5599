"""Multi-head Latent Attention: the formula written here (fp64, gradients), absorbed decoding == the plain path,
the latent cache's size, pruning == masking, capture, and a causal LM that decodes through it."""

import math

import pytest
import torch

from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules import MultiHeadLatentAttention
from multihead.modules.decoder import DecoderConfig
from multihead.modules.variants import AttentionConfig

from lm_helpers import stepwise


def _rope(x, pos):  # rotate-half RoPE, base 10000, written out (frequencies rounded to fp32, as the module's table)
    d = x.shape[-1]
    inv = (10000 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)).double()
    ang = pos[:, None].double() * inv[None]  # (L, d/2)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _formula(m, x, causal):
    b, n, _ = x.shape
    h, d, r = m.num_heads, m.head_dim, m.rope_dim
    c = x @ m.w_dkv.weight.T
    c = c / torch.sqrt(c.square().mean(-1, keepdim=True) + 1e-6) * m.kv_norm.weight.double()
    k_c = (c @ m.w_uk.weight.T).view(b, n, h, d).transpose(1, 2)
    v = (c @ m.w_uv.weight.T).view(b, n, h, d).transpose(1, 2)
    pos = torch.arange(n)
    k_r = _rope(x @ m.w_kr.weight.T, pos)[:, None].expand(b, h, n, r)
    q_c = (x @ m.w_uq.weight.T).view(b, n, h, d).transpose(1, 2)
    q_r = _rope((x @ m.w_qr.weight.T).view(b, n, h, r).transpose(1, 2), pos)
    s = (torch.cat([q_c, q_r], -1) @ torch.cat([k_c, k_r], -1).transpose(-2, -1)) / math.sqrt(d + r)
    if causal:
        s = s.masked_fill(pos[None, :] > pos[:, None], -math.inf)
    z = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, h * d)
    return z @ m.w_o.weight.T


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("backend", ["reference", "sdpa", "memory_efficient"])
def test_mla_equals_its_formula_in_both_forms(absorb, backend):
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(32, 4, kv_latent=12, rope_dim=8, backend=backend).double()
    with torch.no_grad():
        m.kv_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 9, 32, dtype=torch.float64, requires_grad=True)
    out = m(x, is_causal=True, absorb=absorb)[0]
    want = _formula(m, x, True)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    params = [x, m.w_dkv.weight, m.w_uk.weight, m.w_uv.weight, m.w_kr.weight, m.w_qr.weight]
    for a, b in zip(torch.autograd.grad(out.square().sum(), params), torch.autograd.grad(want.square().sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


def test_absorbed_decoding_equals_the_plain_forward_and_the_cache_is_small():
    torch.manual_seed(1)
    dec = DecoderConfig(
        d_model=64,
        num_heads=8,
        num_layers=2,
        d_ff=128,
        dropout=0.0,
        cross_attention=False,
        norm_first=True,
        attention=AttentionConfig(mla_latent=16, mla_rope_dim=8),
    )
    lm = CausalLM(CausalLMConfig(vocab_size=60, max_len=64, positional="none", decoder=dec)).eval()
    ids = torch.randint(1, 60, (3, 14))
    with torch.no_grad():
        full = lm(ids)  # plain form, no cache
    steps, cache = stepwise(lm, ids, 5)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=0)
    # the cache holds (16 + 8) numbers per token and layer; MHA of the same shape: 2 x 8 heads x 8 = 128
    per_token = sum(layer.k.shape[-1] + layer.v.shape[-1] for layer in cache.self_attn)
    assert per_token == 2 * (16 + 8)  # latent + rope key per layer; MHA here would cache 2 x (2 x 8 x 8) = 256
    for policy in ("window", "adakv", "streaming"):  # no per-head keys to evict: every KV policy is refused
        with pytest.raises(ValueError, match="compressed latent instead .*use the full cache"):
            lm.new_cache(policy=policy, budget=8)
    assert lm.decoder.layers[0].self_attn.cache_numbers_per_token() == 24


def test_left_padded_prompts_and_pruning_and_capture():
    torch.manual_seed(2)
    m = MultiHeadLatentAttention(32, 4, kv_latent=12, rope_dim=8).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        masked = m(x, is_causal=True, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0]))[0]
        m.prune_heads([1])
        torch.testing.assert_close(m(x, is_causal=True)[0], masked, atol=1e-6, rtol=0)
    assert m.num_heads == 3 and m.pruned_heads == [1]
    from multihead.modules.capture import capture

    with capture(m, ("pattern",)) as c, torch.no_grad():
        m(x, is_causal=True)
    assert c.pattern(0).shape == (2, 3, 7, 7)
    with pytest.raises(ValueError, match="self-attention"):
        m(x, torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="even rope_dim"):
        MultiHeadLatentAttention(32, 4, rope_dim=7)


@pytest.mark.parametrize("absorb", [False, True])
def test_capture_stats_on_mla_equals_the_formula(absorb):
    """``hook_stats`` fires on MLA (both forms): entropy and first-token mass of the written-out softmax, fp64."""
    from multihead.modules.capture import capture

    torch.manual_seed(3)
    m = MultiHeadLatentAttention(32, 4, kv_latent=12, rope_dim=8).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    h, d, r, n = m.num_heads, m.head_dim, m.rope_dim, x.shape[1]
    pos = torch.arange(n)
    c = x @ m.w_dkv.weight.T
    c = c / torch.sqrt(c.square().mean(-1, keepdim=True) + 1e-6) * m.kv_norm.weight
    k = torch.cat(
        [
            (c @ m.w_uk.weight.T).view(2, n, h, d).transpose(1, 2),
            _rope(x @ m.w_kr.weight.T, pos)[:, None].expand(2, h, n, r),
        ],
        -1,
    )
    q = torch.cat(
        [
            (x @ m.w_uq.weight.T).view(2, n, h, d).transpose(1, 2),
            _rope((x @ m.w_qr.weight.T).view(2, n, h, r).transpose(1, 2), pos),
        ],
        -1,
    )
    s = (q @ k.transpose(-2, -1) / math.sqrt(d + r)).masked_fill(pos[None, :] > pos[:, None], -math.inf)
    p = torch.softmax(s, -1)
    with capture(m, ("stats",)) as cap, torch.no_grad():
        m(x, is_causal=True, absorb=absorb)
    st = cap.stats(0)
    torch.testing.assert_close(st.entropy, -(p * p.clamp_min(1e-300).log()).sum(-1), atol=1e-8, rtol=0)
    torch.testing.assert_close(st.mass["first"], p[..., 0], atol=1e-10, rtol=0)
