"""Modern MHA variants as options of the one MultiHeadAttention: gated attention and ALiBi, each against a
plain-PyTorch formula written here (fp64, outputs and gradients), with pruning and the KV cache."""

import math

import pytest
import torch

from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules import MultiHeadAttention, build_attention
from multihead.modules.attention import alibi_slopes
from multihead.modules.decoder import DecoderConfig

from lm_helpers import randomise_sinks, small_lm, stepwise


def _qkv(m, x):
    """Per-head q, k, v of the module's projections, written out; k, v repeated for grouped-query heads."""
    b, n, _ = x.shape
    h, g, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = (x @ m.w_q.weight.T + m.w_q.bias).view(b, n, h, d).transpose(1, 2)
    k = (x @ m.w_k.weight.T + m.w_k.bias).view(b, n, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    v = (x @ m.w_v.weight.T + m.w_v.bias).view(b, n, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    return q, k, v


def _allowed(n, causal, keep):
    """(B, 1, N, N) bool: the causal rule and key padding."""
    i = torch.arange(n)
    allowed = (i[None, :] <= i[:, None]) if causal else torch.ones(n, n, dtype=torch.bool)
    return allowed & keep[:, None, None, :] if keep is not None else allowed


def _formula(m, x, *, causal=False, keep=None):
    """softmax(q k^T / sqrt(d) + alibi + masks) v per head, gate, output projection -- written out."""
    b, n, e = x.shape
    q, k, v = _qkv(m, x)
    s = q @ k.transpose(-2, -1) / math.sqrt(m.head_dim)
    i = torch.arange(n)
    if m.alibi_slopes is not None:
        s = s - m.alibi_slopes.double()[:, None, None] * (i[:, None] - i[None, :]).abs()
    s = s.masked_fill(~_allowed(n, causal, keep), -math.inf)
    z = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, e)
    if m.w_gate is not None:
        z = z * torch.sigmoid(x @ m.w_gate.weight.T + m.w_gate.bias)
    return z @ m.w_o.weight.T + m.w_o.bias


@pytest.mark.parametrize("gate,alibi", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("causal", [False, True])
def test_variant_equals_its_formula_with_gradients(gate, alibi, causal):
    torch.manual_seed(0)
    m = MultiHeadAttention(24, 4, gate=gate, alibi=alibi, need_weights=False).double()
    x = torch.randn(2, 9, 24, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    out = m(x, key_padding_mask=keep, is_causal=causal)[0]
    want = _formula(m, x, causal=causal, keep=keep)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    g_out = torch.autograd.grad(out.square().sum(), [x] + list(m.parameters()))
    g_want = torch.autograd.grad(want.square().sum(), [x] + list(m.parameters()))
    for a, b in zip(g_out, g_want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    if gate:  # the gate is learned: its weight receives a gradient
        names = ["x"] + [n for n, _ in m.named_parameters()]
        assert g_out[names.index("w_gate.weight")].abs().sum() > 0


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    s6 = alibi_slopes(6)  # 4 slopes of n=4, then every other of n=8
    torch.testing.assert_close(s6, torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))


@pytest.mark.parametrize("gate,alibi", [(True, False), (False, True)])
def test_pruned_variant_equals_masked(gate, alibi):
    torch.manual_seed(1)
    m = MultiHeadAttention(32, 4, gate=gate, alibi=alibi, need_weights=False).eval()
    x = torch.randn(2, 7, 32)
    masked = m(x, is_causal=True, head_mask=torch.tensor([1.0, 0.0, 1.0, 0.0]))[0]
    m.prune_heads([1, 3])
    torch.testing.assert_close(m(x, is_causal=True)[0], masked, atol=1e-6, rtol=0)
    if alibi:
        torch.testing.assert_close(m.alibi_slopes, alibi_slopes(4)[[0, 2]])


@pytest.mark.parametrize("variant", [{"gate": True}, {"positional": "alibi"}])
def test_cached_decoding_equals_the_full_forward(variant):
    lm = small_lm(2, variant.get("positional", "learned"), gate=variant.get("gate", False))
    ids = torch.randint(1, 50, (2, 12))
    with torch.no_grad():
        full = lm(ids)
    torch.testing.assert_close(stepwise(lm, ids, 5)[0], full, atol=1e-5, rtol=0)


def test_alibi_runs_at_four_times_the_trained_length_and_learned_positions_cannot():
    torch.manual_seed(3)
    dec = DecoderConfig(
        d_model=32, num_heads=4, num_layers=1, d_ff=64, dropout=0.0, cross_attention=False, norm_first=True
    )
    alibi = CausalLM(CausalLMConfig(vocab_size=50, max_len=16, positional="alibi", decoder=dec)).eval()
    assert not any("pos" in n for n, _ in alibi.named_parameters())  # no position embedding
    with torch.no_grad():
        assert torch.isfinite(alibi(torch.randint(1, 50, (1, 64)))).all()
    learned = CausalLM(CausalLMConfig(vocab_size=50, max_len=16, positional="learned", decoder=dec)).eval()
    with pytest.raises(ValueError, match="max_len"):
        learned(torch.randint(1, 50, (1, 64)))


def _sink_formula(m, x, *, causal, keep):
    b, n, e = x.shape
    q, k, v = _qkv(m, x)
    s = q @ k.transpose(-2, -1) / math.sqrt(m.head_dim)
    e_s = torch.exp(s).masked_fill(~_allowed(n, causal, keep), 0.0)
    p = e_s / (torch.exp(m.sink_logits.double())[:, None, None] + e_s.sum(-1, keepdim=True))  # the sink's formula
    z = (p @ v).transpose(1, 2).reshape(b, n, e)
    return z @ m.w_o.weight.T + m.w_o.bias, p


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memory_efficient"])
@pytest.mark.parametrize("causal,kv", [(False, 4), (True, 4), (True, 2)])
def test_learned_sinks_equal_their_formula_on_every_exact_backend(backend, causal, kv):
    torch.manual_seed(4)
    m = MultiHeadAttention(24, 4, num_kv_heads=kv, sinks=True, backend=backend, need_weights=False).double()
    with torch.no_grad():
        m.sink_logits.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]))
    x = torch.randn(2, 9, 24, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    out = m(x, key_padding_mask=keep, is_causal=causal)[0]
    want, p = _sink_formula(m, x, causal=causal, keep=keep)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    g_out = torch.autograd.grad(out.square().sum(), [x, m.sink_logits, m.w_q.weight])
    g_want = torch.autograd.grad(want.square().sum(), [x, m.sink_logits, m.w_q.weight])
    for a, b in zip(g_out, g_want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    assert g_out[1].abs().min() > 0  # every head's sink is learned
    if backend == "reference":  # weights over the real keys, summing to 1 - the sink's share
        w = m(x, key_padding_mask=keep, is_causal=causal, need_weights=True)[1]
        torch.testing.assert_close(w, p, atol=1e-10, rtol=0)
        assert (w.sum(-1) < 1).all()


def test_sinks_with_the_cache_capture_and_pruning():
    lm = randomise_sinks(small_lm(5, sinks=True))
    ids = torch.randint(1, 50, (2, 10))
    with torch.no_grad():
        full = lm(ids)
    torch.testing.assert_close(stepwise(lm, ids, 4)[0], full, atol=1e-5, rtol=0)
    from multihead.modules.capture import capture

    with capture(lm, ("pattern",)) as c, torch.no_grad():
        lm(ids)
    assert c.pattern(0).shape == (2, 4, 10, 10) and (c.pattern(0).sum(-1) < 1 + 1e-6).all()
    m = lm.decoder.layers[0].self_attn
    x = torch.randn(1, 6, 32)
    with torch.no_grad():
        masked = m(x, is_causal=True, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0]))[0]
        m.prune_heads([1])
        torch.testing.assert_close(m(x, is_causal=True)[0], masked, atol=1e-6, rtol=0)
    assert m.sink_logits.shape == (3,)


def _diff_formula(m, x, *, causal, keep):
    b, n, e = x.shape
    d = m.head_dim
    q, k, v = _qkv(m, x)
    allowed = _allowed(n, causal, keep)

    def soft(a, c):
        return torch.softmax((a @ c.transpose(-2, -1) / math.sqrt(d // 2)).masked_fill(~allowed, -math.inf), -1)

    a1, a2 = soft(q[..., : d // 2], k[..., : d // 2]), soft(q[..., d // 2 :], k[..., d // 2 :])
    lq, lk = m.lambda_q.double(), m.lambda_k.double()
    lam = torch.exp((lq[0] * lk[0]).sum()) - torch.exp((lq[1] * lk[1]).sum()) + m.lambda_init
    o = (a1 - lam * a2) @ v  # (B, H, N, D)
    o = o / torch.sqrt(o.square().mean(-1, keepdim=True) + 1e-5) * m.diff_norm.weight.double()
    z = (o * (1 - m.lambda_init)).transpose(1, 2).reshape(b, n, e)
    return z @ m.w_o.weight.T + m.w_o.bias, a1 - lam * a2


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memory_efficient"])
@pytest.mark.parametrize("causal", [False, True])
def test_differential_attention_equals_its_formula(backend, causal):
    torch.manual_seed(6)
    m = build_attention(32, 4, differential=True, layer_index=2, backend=backend, need_weights=False).double()
    assert m.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.6))
    with torch.no_grad():
        m.diff_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[0, 5:] = False
    out = m(x, key_padding_mask=keep, is_causal=causal)[0]
    want, w_want = _diff_formula(m, x, causal=causal, keep=keep)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    params = [x, m.lambda_q, m.lambda_k, m.w_k.weight, m.diff_norm.weight]
    for a, b in zip(torch.autograd.grad(out.square().sum(), params), torch.autograd.grad(want.square().sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    if backend == "reference":
        w = m(x, key_padding_mask=keep, is_causal=causal, need_weights=True)[1]
        torch.testing.assert_close(w, w_want, atol=1e-10, rtol=0)  # the differential map: rows sum to 1 - lambda


def test_differential_with_rotary_cache_and_pruning():
    lm = small_lm(7, differential=True)
    assert lm.decoder.layers[1].self_attn.lambda_init > lm.decoder.layers[0].self_attn.lambda_init
    ids = torch.randint(1, 50, (2, 10))
    with torch.no_grad():
        full = lm(ids)
        torch.testing.assert_close(stepwise(lm, ids, 4)[0], full, atol=1e-5, rtol=0)
        # the halves are rotated separately: shifting every position leaves the scores unchanged (relative)
        m = lm.decoder.layers[0].self_attn
        q = torch.randn(1, 4, 6, 8)
        a = m.rotary.rotate(q, 0)[..., :4] @ m.rotary.rotate(q, 0)[..., :4].transpose(-2, -1)
        b = m.rotary.rotate(q, 5)[..., :4] @ m.rotary.rotate(q, 5)[..., :4].transpose(-2, -1)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        x = torch.randn(1, 6, 32)
        masked = m(x, is_causal=True, head_mask=torch.tensor([0.0, 1.0, 1.0, 1.0]))[0]
        m.prune_heads([0])
        torch.testing.assert_close(m(x, is_causal=True)[0], masked, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="head_dim=3 is odd"):
        build_attention(12, 4, differential=True)


@pytest.mark.parametrize("causal", [False, True])
def test_talking_heads_equal_their_formula(causal):
    torch.manual_seed(8)
    m = build_attention(24, 4, talking_heads=True, need_weights=False).double()
    with torch.no_grad():
        m.talk_logits.add_(torch.randn(4, 4, dtype=torch.float64) * 0.3)
        m.talk_weights.add_(torch.randn(4, 4, dtype=torch.float64) * 0.3)
    x = torch.randn(2, 7, 24, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[1, 5:] = False
    b, n, e, h, d = 2, 7, 24, 4, 6
    q, k, v = _qkv(m, x)
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    s = torch.stack([sum(m.talk_logits[a, g] * s[:, a] for a in range(h)) for g in range(h)], 1)  # mix logits
    w = torch.softmax(s.masked_fill(~_allowed(n, causal, keep), -math.inf), -1)
    w = torch.stack([sum(m.talk_weights[a, g] * w[:, a] for a in range(h)) for g in range(h)], 1)  # mix weights
    want = (w @ v).transpose(1, 2).reshape(b, n, e) @ m.w_o.weight.T + m.w_o.bias
    out, weights = m(x, key_padding_mask=keep, is_causal=causal, need_weights=True)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(weights, w, atol=1e-10, rtol=0)
    params = [x, m.talk_logits, m.talk_weights]
    for a, c in zip(torch.autograd.grad(out.square().sum(), params), torch.autograd.grad(want.square().sum(), params)):
        torch.testing.assert_close(a, c, atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="cannot be pruned physically"):
        m.prune_heads([0])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(differential=True, talking_heads=True), "cannot be combined"),
        (dict(sinks=True, differential=True), "sink_logits would never be used"),
        (dict(sinks=True, talking_heads=True), "sink_logits would never be used"),
    ],
)
def test_combinations_that_cannot_train_are_refused_at_construction(options, message):
    """Before: accepted, and talk_logits/talk_weights (or sink_logits) never received a gradient."""
    with pytest.raises(ValueError, match=message):
        build_attention(16, 2, **options)
    with pytest.raises(ValueError, match=message):
        small_lm(0, **options)


@pytest.mark.parametrize("flag", ["gate", "differential", "talking_heads"])
def test_mla_refuses_the_options_it_would_ignore(flag):
    """Before: mla_latent silently replaced the self-attention and dropped the other variant flags."""
    with pytest.raises(ValueError, match="does not take " + flag):
        small_lm(0, mla_latent=8, **{flag: True})


@pytest.mark.parametrize(
    "options",
    [dict(), dict(gate=True), dict(alibi=True), dict(sinks=True), dict(differential=True), dict(talking_heads=True)],
)
def test_every_parameter_of_every_accepted_variant_gets_a_gradient(options):
    torch.manual_seed(0)
    m = build_attention(16, 2, **options)
    x = torch.randn(2, 5, 16)
    m(x, x, x, is_causal=True)[0].square().sum().backward()
    unused = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert unused == [] or unused == ["w_k.bias"], unused  # the key bias cancels in the softmax (exact zero)


@pytest.mark.parametrize("options", [dict(differential=True), dict(talking_heads=True)])
def test_hook_stats_fires_on_the_variant_paths_with_the_maps_own_read_outs(options):
    """Before: hook_stats fired only on the plain path, so statistics of differential and talking-heads layers
    recorded nothing. Their read-outs are checked against the explicit map the pattern hook sees."""
    from multihead.modules.capture import capture

    torch.manual_seed(1)
    lm = small_lm(0, **options)
    ids = torch.randint(0, 50, (2, 9))
    with capture(lm, ("stats", "pattern"), stats={"offsets": (-1,), "topk": 3}) as cap, torch.no_grad():
        lm(ids)
    for layer in range(2):
        st, w = cap.stats(layer), cap.pattern(layer).double()  # (B, H, L, L)
        torch.testing.assert_close(st.received.double(), w.sum(-2), atol=1e-6, rtol=0)
        torch.testing.assert_close(st.mass["first"].double(), w[..., 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(st.mass["offset-1"][..., 1:].double(), w.diagonal(-1, -2, -1), atol=1e-6, rtol=0)
        i = torch.arange(9.0)
        torch.testing.assert_close(
            st.distance.double(), (w * (i[:, None] - i[None, :]).abs()).sum(-1), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(st.topk_weight.double(), w.topk(3, -1).values, atol=1e-6, rtol=0)
        assert torch.isfinite(st.entropy).all() and (st.entropy >= 0).all()


def test_map_stats_of_a_softmax_equals_the_exact_tile_statistics():
    from multihead.attention.stats import attention_stats, map_stats

    torch.manual_seed(2)
    q, k = torch.randn(2, 3, 7, 8, dtype=torch.float64), torch.randn(2, 3, 7, 8, dtype=torch.float64)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    w = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~causal, -math.inf), -1)
    a = attention_stats(q, k, is_causal=True, topk=2, offsets=(-1,), thumbnail=3)
    b = map_stats(w, topk=2, offsets=(-1,), thumbnail=3)
    for name in ("entropy", "received", "distance", "topk_weight", "thumbnail"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), atol=1e-10, rtol=0)
    torch.testing.assert_close(b.mass["offset-1"], a.mass["offset-1"], atol=1e-12, rtol=0)
    torch.testing.assert_close(b.lse, torch.zeros_like(b.lse), atol=1e-12, rtol=0)  # log of a row sum of 1


@pytest.mark.parametrize("bad", [torch.zeros(3, 4), torch.zeros(1, 2, 3, 3, dtype=torch.long), [[0.5]]])
def test_map_stats_names_what_it_takes(bad):
    from multihead.attention.stats import map_stats

    with pytest.raises(ValueError, match=r"floating \(B, H, Lq, Lk\) map"):
        map_stats(bad)
