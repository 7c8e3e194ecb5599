"""Attention found by observation (:mod:`multihead.modules.observe`): models multihead has no glue for -- PyTorch's
own ``nn.TransformerEncoder``, a user's module calling ``F.scaled_dot_product_attention`` (causal, grouped-query),
an HF model in its ``sdpa`` mode -- give exact per-head patterns, per-head outputs and head ablation, checked against
each model's own computation; with nothing captured the model runs untouched; what cannot be observed is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multihead.modules.anatomy import anatomy
from multihead.modules.capture import capture
from multihead.modules.observe import ObserveError, observe, unobserve


def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def test_pytorchs_transformer_encoder_patterns_equal_its_own_weights():
    enc, x = _encoder(), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True  # PyTorch's key padding: True = ignore
    with torch.no_grad():
        before = enc(x, src_key_padding_mask=pad)
    observe(enc, x)
    try:
        with torch.no_grad():
            torch.testing.assert_close(enc(x, src_key_padding_mask=pad), before)  # nothing captured: its own kernels
            with capture(enc, ("pattern", "z")) as cache:
                got = enc(x, src_key_padding_mask=pad)
        torch.testing.assert_close(got, before, atol=1e-5, rtol=1e-5)
        body = anatomy(enc)
        assert body.source == "observed" and [s.name for s in body.sites] == [
            "layers.0.self_attn",
            "layers.1.self_attn",
        ]
        assert all(s.num_heads == 4 and s.head_dim == 8 and s.splits_per_head for s in body.sites)
        with torch.no_grad():
            h = x
            for i, layer in enumerate(enc.layers):  # the module's own weights, head by head
                _, w = layer.self_attn(h, h, h, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
                torch.testing.assert_close(cache.pattern(i), w, atol=1e-6, rtol=1e-5)
                h = layer(h, src_key_padding_mask=pad)
    finally:
        unobserve(enc)


def test_zeroing_a_head_equals_zeroing_its_slice_before_the_output_projection():
    enc, x = _encoder(), torch.randn(1, 6, 32)
    observe(enc, x)
    head = 2
    try:
        handle = anatomy(enc).sites[0].module.hook_z.add_hook(lambda z, hook: z.index_fill(1, torch.tensor([head]), 0))
        with torch.no_grad():
            got = enc(x)  # hooks serve while the observed model runs
        handle.remove()
    finally:
        unobserve(enc)
    mha = enc.layers[0].self_attn  # by hand: the heads' outputs, head 2 zeroed, merged and projected
    with torch.no_grad():
        q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, -1)
        split = [t.view(1, 6, 4, 8).transpose(1, 2) for t in (q, k, v)]
        z = torch.softmax(split[0] @ split[1].transpose(-1, -2) / 8**0.5, -1) @ split[2]
        z[:, head] = 0
        attn = mha.out_proj(z.transpose(1, 2).reshape(1, 6, 32))
        layer = enc.layers[0]
        h = layer.norm1(x + attn)
        want = enc.layers[1](layer.norm2(h + layer.linear2(F.relu(layer.linear1(h)))))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class CausalGQA(nn.Module):
    """A user's own attention (timm's shape): fused q/k/v, F.scaled_dot_product_attention, causal, 2 key/value heads."""

    def __init__(self, e: int = 32, h: int = 4, g: int = 2):
        super().__init__()
        self.h, self.g, self.d = h, g, e // h
        self.qkv = nn.Linear(e, (h + 2 * g) * self.d)
        self.proj = nn.Linear(e, e)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.g * self.d, self.g * self.d], -1)
        q = q.view(b, n, self.h, self.d).transpose(1, 2)
        k, v = (t.view(b, n, self.g, self.d).transpose(1, 2) for t in (k, v))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.proj(z.transpose(1, 2).reshape(b, n, -1))


def test_a_users_causal_grouped_query_module_is_observed():
    torch.manual_seed(1)
    model = nn.Sequential(CausalGQA(), nn.GELU(), CausalGQA()).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        before = model(x)
    observe(model, x)
    try:
        with torch.no_grad(), capture(model, ("pattern", "q", "k")) as cache:
            got = model(x)
        torch.testing.assert_close(got, before, atol=1e-5, rtol=1e-5)
        s = anatomy(model).sites[0]
        assert (s.name, s.num_heads, s.num_kv_heads, s.head_dim, s.splits_per_head) == ("0", 4, 2, 8, False)
        q, k = cache["0.hook_q"], cache["0.hook_k"].repeat_interleave(2, 1)
        scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), -torch.inf)
        torch.testing.assert_close(cache.pattern(0), scores.softmax(-1), atol=1e-6, rtol=1e-5)
    finally:
        unobserve(model)


class GQAOrRepeated(CausalGQA):
    """transformers 4.x's SDPA path: the key/value heads grouped (``enable_gqa``) when no mask is given, repeated to
    the query heads (``repeat_kv``) when one is."""

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.g * self.d, self.g * self.d], -1)
        q = q.view(b, n, self.h, self.d).transpose(1, 2)
        k, v = (t.view(b, n, self.g, self.d).transpose(1, 2) for t in (k, v))
        if mask is None:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = (
                t[:, :, None].expand(b, self.g, self.h // self.g, n, self.d).reshape(b, self.h, n, self.d)
                for t in (k, v)
            )
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(z.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("probe_mask", [True, False])
def test_key_value_heads_grouped_on_one_call_and_repeated_on_another_are_one_site(probe_mask):
    torch.manual_seed(2)
    model = GQAOrRepeated().eval()
    x = torch.randn(2, 7, 32)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    observe(model, x, causal if probe_mask else None)
    try:
        for mask in (None, causal):  # each call as the probe made it, and as it did not
            with torch.no_grad():
                plain = model(x, mask)
            with torch.no_grad(), capture(model, ("pattern", "q", "k")) as cache:
                got = model(x, mask)
            torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
            k = cache[".hook_k"]  # the heads the probe saw, on either call
            assert k.shape[1] == (4 if probe_mask else 2)
            q, k = cache[".hook_q"], k.repeat_interleave(4 // k.shape[1], 1)
            scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~causal, -torch.inf)
            torch.testing.assert_close(cache.pattern(0), scores.softmax(-1), atol=1e-6, rtol=1e-5)
    finally:
        unobserve(model)


def test_what_cannot_be_observed_is_refused_by_name():
    with pytest.raises(ObserveError, match="no attention call was seen"):
        observe(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(1, 4))
    enc, x = _encoder(), torch.randn(1, 5, 32)
    observe(enc, x)
    try:
        with pytest.raises(ObserveError, match="observed already"):
            observe(enc, x)
        enc.layers.append(enc.layers[0])  # a model that changed since the probe: one more attention call
        with pytest.raises(ObserveError, match="called attention 3 times in one forward, where the probe pass saw 2"):
            with capture(enc):
                enc(x)
        enc.layers.pop(-1)
        with capture(enc) as cache:  # the model as observed serves again
            with torch.no_grad():
                enc(x)
        assert len(cache.patterns()) == 2
    finally:
        unobserve(enc)
    with pytest.raises(ObserveError, match="is not observed"):
        unobserve(enc)
    assert not any(n.endswith("hook_z") for n, _ in enc.named_modules())
