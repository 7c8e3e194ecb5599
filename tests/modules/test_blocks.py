"""Positional encodings, FeedForward, EncoderBlock (parity with nn.TransformerEncoderLayer), TransformerEncoder."""

import math

import pytest
import torch
import torch.nn as nn

import multihead as mh


def test_sinusoidal_matches_formula():
    pe = mh.SinusoidalPositionalEncoding(16, max_len=50)
    x = torch.zeros(1, 10, 16)
    out = pe(x)[0]
    p, i = 7, 3
    assert out[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 16)), abs=1e-6)
    assert out[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 16)), abs=1e-6)
    with pytest.raises(ValueError, match="raise max_len"):
        pe(torch.zeros(1, 51, 16))


def test_sinusoidal_odd_width():
    assert mh.SinusoidalPositionalEncoding(15, max_len=8)(torch.zeros(1, 4, 15)).shape == (1, 4, 15)


def test_learned_positions_are_trainable():
    pe = mh.LearnedPositionalEncoding(8, max_len=10)
    pe(torch.zeros(2, 5, 8)).sum().backward()
    assert pe.embedding.weight.grad[:5].abs().sum() > 0 and pe.embedding.weight.grad[5:].abs().sum() == 0


def test_rotary_scores_depend_on_relative_position_only():
    rope = mh.RotaryEmbedding(8)
    q, k = torch.randn(8), torch.randn(8)

    def score(pq, pk):
        rq = rope.rotate(q.view(1, 1, 1, 8).expand(1, 1, pq + 1, 8))[0, 0, pq]
        rk = rope.rotate(k.view(1, 1, 1, 8).expand(1, 1, pk + 1, 8))[0, 0, pk]
        return (rq @ rk).item()

    assert score(5, 3) == pytest.approx(score(12, 10), abs=1e-4)
    assert score(5, 3) != pytest.approx(score(5, 4), abs=1e-3)
    with pytest.raises(ValueError, match="even head_dim"):
        mh.RotaryEmbedding(7)


def test_rotary_kv_cache_alignment():
    """With Lq < Lk the queries are the last positions: same result as slicing a full-length call."""
    rope = mh.RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    full_q, full_k = rope(q, k)
    last_q, k2 = rope(q[:, :, 4:], k)
    torch.testing.assert_close(last_q, full_q[:, :, 4:])
    torch.testing.assert_close(k2, full_k)


def _copy_torch_layer(torch_layer: nn.TransformerEncoderLayer, ours: mh.EncoderBlock) -> None:
    ours.attn.load_state_dict(mh.MultiHeadAttention.from_torch(torch_layer.self_attn).state_dict())
    ours.ffn.w_1.load_state_dict(torch_layer.linear1.state_dict())
    ours.ffn.w_2.load_state_dict(torch_layer.linear2.state_dict())
    ours.norm1.load_state_dict(torch_layer.norm1.state_dict())
    ours.norm2.load_state_dict(torch_layer.norm2.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_encoder_block_matches_torch_layer(norm_first, activation, padded):
    ref = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    ours = mh.EncoderBlock(32, 4, 64, dropout=0.0, activation=activation, norm_first=norm_first).eval()
    _copy_torch_layer(ref, ours)
    x = torch.randn(3, 6, 32)
    keep = torch.ones(3, 6, dtype=torch.bool)
    if padded:
        keep[1, 4:] = False
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=~keep if padded else None)
        got = ours(x, key_padding_mask=keep if padded else None)
    if padded:  # torch's fast path zeroes padded positions' outputs (nested tensors); compare real tokens
        torch.testing.assert_close(got[keep], expected[keep], rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_encoder_block_gradients_and_hooks():
    block = mh.EncoderBlock(16, 2, dropout=0.1)
    x = torch.randn(2, 5, 16, requires_grad=True)
    names = sorted(n for n in mh.hook_points(block))
    assert names == [
        "attn.hook_k",
        "attn.hook_pattern",
        "attn.hook_q",
        "attn.hook_stats",
        "attn.hook_v",
        "attn.hook_z",
        "hook_attn_out",
        "hook_mlp_out",
        "hook_resid_post",
    ]
    block(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in block.parameters())


def test_transformer_encoder_stack_and_head_mask():
    enc = mh.TransformerEncoder(d_model=16, num_heads=4, num_layers=3, dropout=0.0, norm_first=True).eval()
    assert enc.num_heads == [4, 4, 4] and enc.final_norm is not None
    x = torch.randn(2, 5, 16)
    ones = torch.ones(3, 4)
    torch.testing.assert_close(enc(x, head_mask=ones), enc(x))
    hm = ones.clone()
    hm[1, 2] = 0
    assert not torch.allclose(enc(x, head_mask=hm), enc(x))
    with pytest.raises(ValueError, match="one row per layer"):
        enc(x, head_mask=torch.ones(2, 4))


def test_encoder_with_rotary_and_gqa():
    enc = mh.TransformerEncoder(d_model=32, num_heads=4, num_kv_heads=2, num_layers=2, rotary=True)
    assert enc.layers[0].attn.rotary is enc.layers[1].attn.rotary  # one shared module, no parameters
    out = enc(torch.randn(2, 7, 32), is_causal=True)
    assert out.shape == (2, 7, 32)


def test_feedforward_activation_error():
    with pytest.raises(ValueError, match="choose one of"):
        mh.FeedForward(8, activation="swish9")


@pytest.mark.parametrize("norm_first", [False, True])
def test_unpadded_path_equals_padded_path(norm_first):
    """Packing real tokens (no work on padding) gives the padded computation's values on real tokens, and grads."""
    torch.manual_seed(0)
    packed = mh.TransformerEncoder(
        d_model=32, num_heads=4, num_layers=2, dropout=0.0, norm_first=norm_first, num_kv_heads=2, rotary=True
    )
    padded = mh.TransformerEncoder(packed.config.__class__(**{**packed.config.to_dict(), "unpad": False}))
    padded.load_state_dict(packed.state_dict())
    x = torch.randn(3, 7, 32)
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[0, 5:] = False
    keep[2, 1:] = False
    hm = torch.rand(2, 4)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    a = packed(xa, key_padding_mask=keep, head_mask=hm)
    b = padded(xb, key_padding_mask=keep, head_mask=hm)
    torch.testing.assert_close(a[keep], b[keep], rtol=1e-5, atol=1e-5)
    assert (a[~keep] == 0).all()
    a[keep].sum().backward()
    b[keep].sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    for (name, pa), pb in zip(packed.named_parameters(), padded.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_block_hooks_fall_back_to_padded_layout():
    enc = mh.TransformerEncoder(d_model=16, num_heads=2, num_layers=1, dropout=0.0)
    seen = []
    enc.layers[0].hook_resid_post.add_hook(lambda t, hook: seen.append(t.shape))
    keep = torch.tensor([[True, True, False]])
    enc(torch.randn(1, 3, 16), key_padding_mask=keep)
    assert seen == [(1, 3, 16)]
