"""Linear attention: exact identities, masking, and Performer's error shrinking as features grow."""

import pytest
import torch

import multihead as mh
from multihead.attention.backends.linear import elu_attention, performer_attention


def _softmax_attention(q, k, v, keep=None, causal=False):
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def _qkv(length=128, d=16, seed=0, spread=0.5):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, length, d, generator=gen, dtype=torch.float64) * spread for _ in range(3)]


def test_elu_matches_its_quadratic_form_with_padding_and_causal():
    q, k, v = _qkv()
    keep = torch.arange(128)[None, :] < torch.tensor([128, 70])[:, None]
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    for causal in (False, True):
        a = fq @ fk.transpose(-2, -1)  # (b, h, i, j), the quadratic form the linear one factorises
        a = a * keep[:, None, None, :]
        if causal:
            a = a.tril()
        ref = (a @ v) / a.sum(-1, keepdim=True)
        out = elu_attention(q, k, v, key_padding=keep, is_causal=causal)
        assert (out - ref).abs().max().item() < 1e-10, causal


def test_performer_error_shrinks_as_features_grow():
    """Performer's claim, asserted: mean error vs softmax attention falls with m, and is small at m = 1024."""
    q, k, v = _qkv(length=256, d=16, seed=1)
    exact = _softmax_attention(q, k, v)
    errors = {}
    for m in (16, 64, 256, 1024):
        runs = [performer_attention(q, k, v, num_features=m, seed=s) for s in range(3)]
        errors[m] = sum((r - exact).abs().mean().item() for r in runs) / len(runs)
    assert errors[16] > errors[64] > errors[256] > errors[1024], errors
    assert errors[1024] < 0.25 * errors[16], errors
    assert errors[1024] < 0.02, errors  # v has mean |v| ~ 0.4


def test_performer_causal_and_padding_follow_softmax():
    q, k, v = _qkv(length=96, d=8, seed=2, spread=0.4)
    keep = torch.arange(96)[None, :] < torch.tensor([96, 50])[:, None]
    for causal in (False, True):
        exact = _softmax_attention(q, k, v, keep, causal)
        approx = performer_attention(q, k, v, num_features=1024, key_padding=keep, is_causal=causal)
        assert (approx - exact)[0].abs().mean().item() < 0.03 and (approx - exact)[1, :, :50].abs().mean() < 0.03


def test_linear_backends_through_the_seam():
    q, k, v = (t.float() for t in _qkv(length=64, d=8))
    names = dict(mh.explain(q, k))
    assert "approximate" in names["performer"] and "approximate" in names["linear_elu"]  # auto never picks them
    out, _ = mh.attention(q, k, v, backend="performer")
    assert out.shape == q.shape and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="key-padding masks"):
        mh.attention(q, k, v, mask=torch.rand(64, 64) > 0.5, backend="linear_elu")
    g = q.clone().requires_grad_(True)
    mh.attention(g, k, v, backend="linear_elu", is_causal=True)[0].sum().backward()
    assert torch.isfinite(g.grad).all()
