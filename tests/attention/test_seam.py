"""The kernel seam: registry, capabilities, auto selection, errors that name the fix."""

import pytest
import torch

import multihead as mh
from multihead.attention import Capabilities, masks, register_backend
from multihead.attention.registry import _REGISTRY


def qkv(b=2, h=4, l=5, d=8, hkv=None):
    return torch.randn(b, h, l, d), torch.randn(b, hkv or h, l, d), torch.randn(b, hkv or h, l, d)


def test_registry_has_core_backends_with_capabilities():
    bs = mh.list_backends()
    assert {"reference", "sdpa"} <= set(bs)
    assert bs["reference"].capabilities.returns_weights
    assert not bs["sdpa"].capabilities.returns_weights


def test_auto_picks_sdpa_without_weights_and_reference_with():
    q, k, v = qkv()
    reasons = dict(mh.explain(q, k, need_weights=True))
    assert reasons["reference"] is None
    assert "weights" in reasons["sdpa"]
    assert dict(mh.explain(q, k))["sdpa"] is None


def test_named_backend_that_cannot_honour_the_call_says_what_to_do():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="does not return attention weights.*backend='auto'"):
        mh.attention(q, k, v, backend="sdpa", need_weights=True)
    with pytest.raises(ValueError, match="unknown attention backend 'nope'.*reference"):
        mh.attention(q, k, v, backend="nope")


def test_register_a_new_backend_and_auto_uses_it():
    calls = []

    @register_backend("test_spy", Capabilities(returns_weights=False), priority=1000)
    def spy(q, k, v, *, mask, dropout_p, scale, need_weights):
        calls.append(scale)
        return _REGISTRY["sdpa"].fn(q, k, v, mask=mask, dropout_p=dropout_p, scale=scale, need_weights=need_weights)

    try:
        q, k, v = qkv()
        out, _ = mh.attention(q, k, v)
        assert calls == [pytest.approx(8**-0.5)]
        torch.testing.assert_close(out, mh.attention(q, k, v, backend="reference")[0])
        with pytest.raises(ValueError, match="already registered"):
            register_backend("test_spy", Capabilities())(spy)
    finally:
        del _REGISTRY["test_spy"]


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((2, 5, 8), (2, 4, 5, 8), (2, 4, 5, 8)), r"q must be 4-D \(B, H, L, D\).*transpose"),
        (((2, 4, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8)), "multiple of the number of key/value heads"),
        (((2, 4, 5, 8), (2, 4, 5, 7), (2, 4, 5, 8)), "share D"),
        (((2, 4, 5, 8), (3, 4, 5, 8), (3, 4, 5, 8)), "batch sizes differ"),
    ],
)
def test_bad_shapes(shapes, match):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        mh.attention(q, k, v)


def test_bad_masks_name_the_fix():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"\.bool\(\)"):
        mh.attention(q, k, v, mask=torch.ones(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"does not broadcast.*axis Lk.*key_padding_mask"):
        mh.attention(q, k, v, mask=torch.ones(2, 1, 1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout_p"):
        mh.attention(q, k, v, dropout_p=1.5)


def test_causal_mask_alignment_is_bottom_right():
    assert masks.causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True] * 5]
    m = masks.causal_mask(5, 2)
    assert not m[:3].any() and m[3].tolist() == [True, False] and m[4].all()
    assert torch.equal(masks.causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())


def test_mask_converters():
    torch_mask = torch.tensor([[False, True], [False, False]])  # True = ignore
    assert torch.equal(masks.from_torch_mask(torch_mask), ~torch_mask)
    kpm = torch.tensor([[False, True]])  # True = pad
    assert masks.from_torch_key_padding_mask(kpm).tolist() == [[[[True, False]]]]
    assert masks.from_hf_attention_mask(torch.tensor([[1, 0]])).tolist() == [[[[True, False]]]]
    with pytest.raises(ValueError, match="num_heads="):
        masks.from_torch_mask(torch.zeros(4, 2, 2, dtype=torch.bool))
    three = masks.from_torch_mask(torch.zeros(4, 2, 2, dtype=torch.bool), num_heads=2)
    assert three.shape == (2, 2, 2, 2) and three.all()


def test_dropout_is_applied_in_both_backends():
    q, k, v = qkv(l=16)
    for backend in ("reference", "sdpa"):
        torch.manual_seed(1)
        a, _ = mh.attention(q, k, v, dropout_p=0.5, backend=backend)
        b, _ = mh.attention(q, k, v, backend=backend)
        assert not torch.allclose(a, b)
        assert torch.isfinite(a).all()
