"""MultiHeadAttention: tutorial snippets, nn.MultiheadAttention parity, masks, heads, hooks, bad input."""

import warnings

import pytest
import torch
import torch.nn as nn

import multihead as mh
from multihead.attention import masks
from multihead.attention.backends import reference as reference_backend
from multihead.modules import fastpath
from multihead.tutorial import TutorialMultiHeadAttention


def test_tutorial_snippet_shapes():
    x = torch.rand(2, 5, 512)  # batch=2, seq_len=5
    mha = mh.MultiHeadAttention(512, 8)
    o, w = mha(x)
    assert o.shape == (2, 5, 512) and w.shape == (2, 8, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 8, 5))


def test_tutorial_module_equals_ours():
    """The tutorial's hand-written MHA (section 4.1) and ours give the same output and weights."""

    tut = TutorialMultiHeadAttention()  # section 4.1 of the tutorial, verbatim in spirit
    ours = mh.MultiHeadAttention(512, 8)
    ours.load_state_dict(tut.state_dict())  # same parameter names: w_q, w_k, w_v, w_o
    x = torch.rand(2, 5, 512)
    mask = masks.causal_mask(5)
    for m in (None, mask):
        o1, w1 = tut(x, m)
        o2, w2 = ours(x, mask=m)
        torch.testing.assert_close(o2, o1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w2, w1, rtol=1e-5, atol=1e-6)


def test_annotated_transformer_call_style():
    """``mha(q, k, v, mask)`` with a (B, 1, L) padding mask, as in the annotated transformer."""
    mha = mh.MultiHeadAttention(64, 8, dropout=0.1).eval()
    q = torch.randn(2, 4, 64)
    src_mask = torch.tensor([[[1, 1, 1, 0]], [[1, 1, 1, 1]]]).bool()  # (B, 1, L)
    out, w = mha(q, q, q, src_mask)
    assert out.shape == (2, 4, 64)
    assert (w[0, :, :, 3] == 0).all() and (w[1, :, :, 3] > 0).all()


def make_torch_mha(kind):
    if kind == "self":
        return nn.MultiheadAttention(32, 4, batch_first=True)
    if kind == "kdim_vdim":
        return nn.MultiheadAttention(32, 4, kdim=24, vdim=40, batch_first=True)
    if kind == "no_bias":
        return nn.MultiheadAttention(32, 4, bias=False, batch_first=True)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["self", "cross", "kdim_vdim", "no_bias"])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "padding", "both"])
@pytest.mark.parametrize("average", [True, False])
def test_from_torch_parity(kind, mask_kind, average):
    ref = make_torch_mha("self" if kind == "cross" else kind).eval()
    ours = mh.MultiHeadAttention.from_torch(ref).eval()
    b, lq, lk = 3, 5, 7 if kind != "self" else 5
    query = torch.randn(b, lq, 32)
    key = torch.randn(b, lk, ref.kdim) if kind != "self" else query
    value = torch.randn(b, lk, ref.vdim) if kind != "self" else query
    attn_mask = kpm = None
    if mask_kind in ("bool", "both"):
        attn_mask = torch.rand(lq, lk) > 0.7  # True = ignore (PyTorch)
        attn_mask[:, 0] = False
    if mask_kind == "float":
        attn_mask = torch.randn(lq, lk)
    if mask_kind in ("padding", "both"):
        kpm = torch.zeros(b, lk, dtype=torch.bool)
        kpm[0, -2:] = True  # True = pad (PyTorch)
    with torch.no_grad():
        o_ref, w_ref = ref(
            query,
            key,
            value,
            attn_mask=attn_mask,
            key_padding_mask=kpm,
            need_weights=True,
            average_attn_weights=average,
        )
        o, w = ours(
            query,
            key,
            value,
            mask=None if attn_mask is None else masks.from_torch_mask(attn_mask),
            key_padding_mask=None if kpm is None else ~kpm,
            need_weights=True,
            average_attn_weights=average,
        )
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-5)


def test_fused_path_matches_torch_fast_path():
    ref = nn.MultiheadAttention(64, 8, batch_first=True).eval()
    ours = mh.MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        o_ref, _ = ref(x, x, x, need_weights=False)
        o, w = ours(x, need_weights=False)
    assert w is None
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-5)


def test_to_torch_round_trip():
    ours = mh.MultiHeadAttention(32, 4, kdim=16, vdim=20).eval()
    back = ours.to_torch().eval()
    q, k, v = torch.randn(2, 3, 32), torch.randn(2, 6, 16), torch.randn(2, 6, 20)
    with torch.no_grad():
        torch.testing.assert_close(ours(q, k, v)[0], back(q, k, v)[0], rtol=0, atol=1e-5)
    again = mh.MultiHeadAttention.from_torch(back)
    for a, b in zip(ours.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


def test_from_torch_rejects_unsupported_options():
    with pytest.raises(ValueError, match="add_bias_kv"):
        mh.MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="num_kv_heads=None"):
        mh.MultiHeadAttention(16, 4, num_kv_heads=2).to_torch()


def test_fully_masked_sequence_gives_zeros_not_nan():
    """PyTorch's MHA returns NaN for a fully padded sequence (pytorch/pytorch#41508); we return zeros."""
    mha = mh.MultiHeadAttention(16, 2, bias=False)
    x = torch.randn(2, 4, 16, requires_grad=True)
    kpm = torch.tensor([[True, True, False, False], [False, False, False, False]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, w = mha(x, key_padding_mask=kpm)
    assert torch.isfinite(out).all() and (out[1] == 0).all() and (w[1] == 0).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    ref = nn.MultiheadAttention(16, 2, bias=False, batch_first=True)
    o_ref, _ = ref(x, x, x, key_padding_mask=~kpm)
    assert torch.isnan(o_ref[1]).all()  # the bug we avoid, still present in this torch


def test_inverted_padding_mask_warns():
    mha = mh.MultiHeadAttention(16, 2)
    x = torch.randn(2, 4, 16)
    torch_style = torch.tensor([[False, False, True, True], [False, False, False, True]])  # True = pad
    with pytest.warns(UserWarning, match="True = real token"):
        mha(x, key_padding_mask=torch_style)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mha(x, key_padding_mask=~torch_style)  # the right convention: no warning


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa"])
def test_gqa_equals_mha_with_shared_kv_weights(backend):
    torch.manual_seed(0)
    gqa = mh.MultiHeadAttention(48, 6, num_kv_heads=2, backend=backend)
    full = mh.MultiHeadAttention(48, 6, backend=backend)
    d = 8
    with torch.no_grad():
        full.w_q.load_state_dict(gqa.w_q.state_dict())
        full.w_o.load_state_dict(gqa.w_o.state_dict())
        for src, dst in ((gqa.w_k, full.w_k), (gqa.w_v, full.w_v)):
            w = src.weight.view(2, 1, d, 48).expand(2, 3, d, 48).reshape(48, 48)  # each kv head serves 3 q heads
            bvec = src.bias.view(2, 1, d).expand(2, 3, d).reshape(48)
            dst.weight.copy_(w)
            dst.bias.copy_(bvec)
    x = torch.randn(2, 7, 48)
    torch.testing.assert_close(gqa(x, need_weights=False)[0], full(x, need_weights=False)[0], rtol=1e-5, atol=1e-5)
    assert gqa.w_k.weight.shape == (16, 48)


def test_mqa_parameter_count():
    mqa = mh.MultiHeadAttention(64, 8, num_kv_heads=1)
    assert mqa.w_k.weight.shape == (8, 64) and mqa.w_v.weight.shape == (8, 64)
    assert mqa(torch.randn(1, 3, 64))[1].shape == (1, 8, 3, 3)


def test_head_mask_scales_each_head():
    mha = mh.MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    z_seen = {}
    mha.hook_z.add_hook(lambda z, hook: z_seen.setdefault("z", z))
    hm = torch.tensor([1.0, 0.0, 0.5, 1.0])
    out, _ = mha(x, head_mask=hm)
    z = z_seen["z"] * hm.view(1, 4, 1, 1)  # (B, H, L, D)
    expected = mha.w_o(z.transpose(1, 2).reshape(2, 5, 32))
    torch.testing.assert_close(out, expected)
    hm_grad = torch.ones(4, requires_grad=True)
    mha(x, head_mask=hm_grad)[0].pow(2).sum().backward()
    assert hm_grad.grad.shape == (4,) and (hm_grad.grad != 0).all()
    with pytest.raises(ValueError, match=r"head_mask must be \(4,\)"):
        mha(x, head_mask=torch.ones(3))


def test_hook_points_read_and_edit():
    mha = mh.MultiHeadAttention(32, 4, need_weights=False).eval()
    x = torch.randn(1, 6, 32)
    seen = {}
    handles = [
        getattr(mha, name).add_hook(lambda t, hook, name=name: seen.__setitem__(name, t.shape))
        for name in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z")
    ]
    base, _ = mha(x)
    assert seen == {
        "hook_q": (1, 4, 6, 8),
        "hook_k": (1, 4, 6, 8),
        "hook_v": (1, 4, 6, 8),
        "hook_pattern": (1, 4, 6, 6),
        "hook_z": (1, 4, 6, 8),
    }
    for h in handles:
        h.remove()
    # capturing the pattern leaves the output unchanged and equals the reference weights
    captured = {}
    h = mha.hook_pattern.add_hook(lambda w, hook: captured.setdefault("w", w))
    out, _ = mha(x)
    h.remove()
    torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(captured["w"], mha(x, need_weights=True)[1])
    # editing the pattern changes the output: uniform attention = mean of values
    h = mha.hook_pattern.add_hook(lambda w, hook: torch.full_like(w, 1 / w.shape[-1]))
    edited, _ = mha(x)
    h.remove()
    v = mha.w_v(x)  # (1, 6, 32)
    torch.testing.assert_close(edited, mha.w_o(v.mean(1, keepdim=True).expand(1, 6, 32)), rtol=1e-5, atol=1e-5)


def test_no_lq_by_lk_tensor_without_hooks_or_weights(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("explicit weights were computed")

    monkeypatch.setattr(reference_backend, "probabilities", boom)
    mha = mh.MultiHeadAttention(32, 4, need_weights=False)
    x = torch.randn(2, 9, 32)
    out, w = mha(x, key_padding_mask=torch.ones(2, 9, dtype=torch.bool))
    assert w is None
    out.sum().backward()  # and in training too
    with pytest.raises(AssertionError, match="explicit weights"):
        mha(x, need_weights=True)


def test_causal_self_attention_ignores_the_future():
    mha = mh.MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 16)
    a, _ = mha(x, is_causal=True, need_weights=False)
    b, _ = mha(y, is_causal=True, need_weights=False)
    torch.testing.assert_close(a[:, :4], b[:, :4])


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: mh.MultiHeadAttention(100, 8), r"not divisible by num_heads=8; pick num_heads from \[1, 2, 4, 5"),
        (lambda: mh.MultiHeadAttention(64, 8, num_kv_heads=3), r"pick num_kv_heads from \[1, 2, 4, 8\]"),
        (lambda: mh.MultiHeadAttention(64, 8, backend="flash9"), "unknown attention backend 'flash9'"),
        (lambda: mh.MultiHeadAttention(64, 8, dropout=1.0), r"dropout must be in \[0, 1\)"),
    ],
)
def test_bad_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_forward_inputs():
    mha = mh.MultiHeadAttention(32, 4)
    with pytest.raises(ValueError, match=r"unsqueeze\(0\)"):
        mha(torch.randn(5, 32))
    with pytest.raises(ValueError, match="kdim=16"):
        mha(torch.randn(1, 5, 32), torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="d_model=24"):
        mha(torch.randn(1, 5, 24))
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(torch.randn(1, 5, 32), mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"\.bool\(\)"):
        mha(torch.randn(1, 5, 32), mask=torch.ones(5, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(B, Lk\)"):
        mha(torch.randn(1, 5, 32), key_padding_mask=torch.ones(5, dtype=torch.bool))


@pytest.mark.parametrize("kv", [None, 2])
def test_prune_heads_equals_masking_them(kv):
    """The pruning seam: removing heads physically gives the head-masked output (GQA-aware), all heads included."""
    mha = mh.MultiHeadAttention(32, 4, num_kv_heads=kv).eval()
    x = torch.randn(2, 5, 32)
    drop = [0, 1] if kv else [1, 3]
    hm = torch.ones(4)
    hm[drop] = 0
    expected, _ = mha(x, head_mask=hm, need_weights=False)
    mha.prune_heads(drop)
    got, w = mha(x)
    assert mha.num_heads == 2 and mha.pruned_heads == drop and w.shape == (2, 2, 5, 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    if kv:
        assert mha.num_kv_heads == 1 and mha.w_k.weight.shape == (8, 32)
    mha.prune_heads([0, 1])  # every head gone: only the output bias remains
    out, _ = mha(x)
    assert mha.pruned_heads == [0, 1, 2, 3] and torch.allclose(out, mha.w_o.bias.expand(2, 5, 32))


def test_the_inference_qkv_projection_follows_weight_changes():
    """Without autograd, self-attention projects q, k, v with one matmul over the stacked weights; the stack is
    rebuilt after in-place updates (optimizer steps, load_state_dict), pruning and dtype changes."""
    torch.manual_seed(0)
    mha = mh.MultiHeadAttention(32, 4, num_kv_heads=2, need_weights=False).eval()
    x = torch.randn(2, 5, 32)

    def both():
        with torch.no_grad():
            fused = mha(x)[0]
        with torch.enable_grad():
            plain = mha(x)[0].detach()
        return fused, plain

    fused, plain = both()
    assert torch.allclose(fused, plain, atol=1e-6)
    with torch.no_grad():
        mha.w_k.weight.mul_(2.0)  # in place, as an optimizer step
    fused2, plain2 = both()
    assert not torch.allclose(fused2, fused, atol=1e-4) and torch.allclose(fused2, plain2, atol=1e-6)
    mha.load_state_dict({k: v * 0.5 for k, v in mha.state_dict().items()})
    fused3, plain3 = both()
    assert torch.allclose(fused3, plain3, atol=1e-6)
    mha.prune_heads([0, 1])  # a whole key/value group
    fused4, plain4 = both()
    assert fused4.shape == (2, 5, 32) and torch.allclose(fused4, plain4, atol=1e-6)
    mha.double()
    with torch.no_grad():
        assert mha(x.double())[0].dtype == torch.float64
    # the opt-out really bypasses the stack: a stack poisoned under the current stamp is used only when fusing
    xd = x.double()
    with torch.no_grad():
        mha(xd)  # builds the stack for the float64 weights
        stamp, (w, b) = fastpath._PACKED[mha]
        fastpath._PACKED[mha] = (stamp, (torch.zeros_like(w), None if b is None else torch.zeros_like(b)))
        poisoned = mha(xd)[0]
        mha.fuse_qkv_at_inference = False
        plain_off = mha(xd)[0]
    with torch.enable_grad():
        plain_ref = mha(xd)[0].detach()
    assert not torch.allclose(poisoned, plain_ref) and torch.allclose(plain_off, plain_ref)
