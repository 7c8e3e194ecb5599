"""Attention written by hand (``softmax(q k^T * scale + mask) v`` from products), observed: the heads told apart by
dataflow (a product, a softmax of what it made, a product of the weights with the values), not by names."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multihead.modules.anatomy import anatomy
from multihead.modules.capture import capture
from multihead.modules.observe import BY_HAND, ObserveError, observe, unobserve


class ByHand(nn.Module):
    """nanoGPT's attention as written by hand, with a softmax over a product that is not attention beside it (a
    router whose weights scale the output elementwise): only the softmax whose weights multiply values is a site."""

    def __init__(self, e: int = 32, h: int = 4):
        super().__init__()
        self.h, self.d = h, e // h
        self.c_attn = nn.Linear(e, 3 * e)
        self.c_proj = nn.Linear(e, e)
        self.router = nn.Parameter(torch.randn(e, 3))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, n, e = x.shape
        q, k, v = (t.view(b, n, self.h, self.d).transpose(1, 2) for t in self.c_attn(x).split(e, -1))
        att = (q @ k.transpose(-2, -1)) * (1.0 / self.d**0.5)
        att = att.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, n, e)
        gate = torch.softmax(x @ self.router, -1)  # a softmax of a product that meets no values
        return self.c_proj(y) * gate[..., :1]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(ByHand(), nn.GELU(), ByHand()).eval()


def _by_hand(block: ByHand, x, head: int | None = None):
    """Block ``block`` computed here: its weights, its per-head outputs and its output (head ``head`` zeroed)."""
    b, n, e = x.shape
    q, k, v = (t.view(b, n, 4, 8).transpose(1, 2) for t in block.c_attn(x).split(e, -1))
    w = ((q @ k.transpose(-2, -1)) / 8**0.5).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)
    w = w.softmax(-1)
    z = w @ v
    if head is not None:
        z[:, head] = 0
    out = block.c_proj(z.transpose(1, 2).reshape(b, n, e)) * torch.softmax(x @ block.router, -1)[..., :1]
    return (q, k, v), w, z, out


def test_attention_written_by_hand_gives_its_weights_and_heads():
    model, x = _model(), torch.randn(2, 7, 32)
    with torch.no_grad():
        before = model(x)
    observe(model, x)
    try:
        body = anatomy(model)
        assert [(s.name, s.module.func, s.num_heads, s.num_kv_heads, s.head_dim) for s in body.sites] == [
            ("0", BY_HAND, 4, 4, 8),
            ("2", BY_HAND, 4, 4, 8),
        ]
        with torch.no_grad():
            torch.testing.assert_close(model(x), before)  # nothing captured: its own computation
            with capture(model, ("pattern", "q", "k", "v", "z")) as cache:
                got = model(x)
            (q, k, v), w, z, _ = _by_hand(model[0], x)
        torch.testing.assert_close(got, before, atol=1e-6, rtol=1e-5)
        for name, want in (("q", q), ("k", k), ("v", v), ("z", z), ("pattern", w)):
            torch.testing.assert_close(cache.get_layer(name, 0), want, atol=1e-6, rtol=1e-5)
        # zeroing one head through hook_z (or its values through hook_v) is zeroing it by hand
        zero = lambda t, hook: t.index_fill(1, torch.tensor([1]), 0)  # noqa: E731
        for hook in ("hook_z", "hook_v"):
            handle = getattr(body.sites[0].module, hook).add_hook(zero)
            with torch.no_grad():
                ablated = model(x)
            handle.remove()
            with torch.no_grad():
                want = model[2](model[1](_by_hand(model[0], x, head=1)[3]))
            torch.testing.assert_close(ablated, want, atol=1e-6, rtol=1e-5)
            assert (ablated - before).abs().max() > 1e-3
    finally:
        unobserve(model)


def test_what_attention_by_hand_does_not_serve_is_refused_by_name():
    model, x = _model(), torch.randn(1, 5, 32)
    observe(model, x)
    try:
        site = anatomy(model).sites[0].module
        handle = site.hook_q.add_hook(lambda q, hook: q * 2)  # changing queries: its scale and mask come after
        with pytest.raises(ObserveError, match="can read its queries and keys but not change them"):
            with torch.no_grad():
                model(x)
        handle.remove()
        with pytest.raises(ObserveError, match="hook_stats is not served there"):
            with torch.no_grad(), capture(model, ("stats",)):
                model(x)
        with torch.no_grad(), capture(model, ("pattern",)) as cache:  # and the model serves again
            model(x)
        assert len(cache.patterns()) == 2
    finally:
        unobserve(model)


class ThreeD(nn.Module):
    """Attention by hand on ``(B*H, L, D)`` tensors, softmax over ``(B*H, Lq, Lk)`` scores: its heads cannot be told
    apart from the shapes."""

    def forward(self, x):
        s = torch.bmm(x, x.transpose(1, 2)).softmax(-1)
        return torch.bmm(s, x)


def test_a_softmax_over_scores_not_split_into_heads_is_refused_by_name():
    model = ThreeD()
    with pytest.raises(ObserveError, match=r"ThreeD computes attention by hand over 3-D scores \(6, 5, 5\): the "):
        observe(model, torch.randn(6, 5, 8))
    assert not any(n.endswith("hook_z") for n, _ in model.named_modules())
    for bad in (0, -2, 1.5, True, "3"):  # refused before the probe runs
        with pytest.raises(ObserveError, match="example_batch must be the example's batch size"):
            observe(model, torch.randn(6, 5, 8), example_batch=bad)
    observe(model, torch.randn(6, 5, 8), example_batch=2)  # told the batch: 3 heads of batch 2
    try:
        x = torch.randn(6, 5, 8)
        with torch.no_grad(), capture(model, ("pattern",)) as cache:
            model(x)
        w = torch.bmm(x, x.transpose(1, 2)).softmax(-1)
        torch.testing.assert_close(cache.pattern(0), w.view(2, 3, 5, 5))
    finally:
        unobserve(model)


class Banded(nn.Module):
    """Attention whose weights are padded before they meet the values (banded and chunked attention reshape theirs):
    the product is not of whole (batch, heads, queries, keys) weights."""

    def forward(self, x):
        q = x.view(1, 5, 2, 4).transpose(1, 2)
        w = (q @ q.transpose(-1, -2)).softmax(-1)
        return F.pad(w, (0, 1)) @ F.pad(q, (0, 0, 0, 1))


class TwoSoftmaxes(nn.Module):
    """Global attention followed, and local attention whose scores are joined before the softmax and whose weights
    are sliced before the values (PEGASUS-X's global-local layer, reduced)."""

    def forward(self, x):
        q = x.view(1, 6, 2, 4).transpose(1, 2)
        g = (q @ q.transpose(-1, -2)).softmax(-1) @ q
        scores = torch.cat([q[:, :, :3] @ q[:, :, :3].transpose(-1, -2), q[:, :, 3:] @ q[:, :, 3:].transpose(-1, -2)])
        w = scores.softmax(-1)
        return g + torch.cat([w[:1] @ q[:, :, :3], w[1:] @ q[:, :, 3:]], 2)


def test_weights_reshaped_before_the_values_are_refused_by_name():
    with pytest.raises(ObserveError, match="multiplies values by its attention weights cut, padded or joined"):
        observe(Banded(), torch.randn(1, 5, 8))
    with pytest.raises(ObserveError, match="(calls attention 2 times|cut, padded or joined|in 2 parts)"):
        observe(TwoSoftmaxes(), torch.randn(1, 6, 8))


class TalkingHeads(nn.Module):
    """CaiT's talking-heads attention, reduced: the heads' scores mixed by a learned projection before the softmax,
    and the weights mixed again after it, so no one head's pattern is what reaches the values."""

    def __init__(self, h: int = 2):
        super().__init__()
        self.proj_l, self.proj_w = nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x):
        q = x.view(1, 5, 2, 4).transpose(1, 2)
        att = self.proj_l((q @ q.transpose(-1, -2)).permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(-1)
        att = self.proj_w(att.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return att @ q


def test_heads_mixed_around_the_softmax_are_refused_by_name_not_missed():
    with pytest.raises(ObserveError, match=r"TalkingHeads mixes its attention scores through a learned projection"):
        observe(TalkingHeads(), torch.randn(1, 5, 8))


class Gated(nn.Module):
    """ConViT's gated positional self-attention, reduced: the softmax of q k^T mixed with a second, positional
    distribution of the same size before the values, so the first softmax is not what reaches them."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Linear(3, 2)
        self.gate = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        q = x.view(1, 5, 2, 4).transpose(1, 2)
        patch = (q @ q.transpose(-1, -2)).softmax(-1)
        pos = self.pos(torch.randn(1, 5, 5, 3)).permute(0, 3, 1, 2).softmax(-1)
        g = self.gate.sigmoid().view(1, -1, 1, 1)
        return ((1 - g) * patch + g * pos) @ q


def test_weights_mixed_with_another_distribution_are_refused_by_name():
    with pytest.raises(ObserveError, match=r"mixed with another tensor of their size \(gated positional attention\)"):
        observe(Gated(), torch.randn(1, 5, 8))
