"""The anatomy every analysis reads (:mod:`multihead.modules.anatomy`): what multihead's own models are made of,
a source plugged in for a model multihead does not know, and the refusal for a model with no attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multihead.interpret.causal import patching as P
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules import anatomy as A
from multihead.modules.capture import capture
from multihead.modules.decoder import DecoderConfig


def _lm(**decoder) -> CausalLM:
    torch.manual_seed(0)
    dec = dict(d_model=32, num_heads=4, num_layers=3, d_ff=64, cross_attention=False, norm_first=True, dropout=0.0)
    dec.update(decoder)
    return CausalLM(CausalLMConfig(vocab_size=50, max_len=64, positional="rope", decoder=DecoderConfig(**dec))).eval()


def test_a_native_lm_is_described_by_its_own_modules():
    model = _lm(attention={"num_kv_heads": 2})
    body = A.anatomy(model)
    assert body.source == "native" and body.runner is model
    assert [s.module for s in body.sites] == [layer.self_attn for layer in model.decoder.layers]
    assert [(s.num_heads, s.num_kv_heads, s.head_dim, s.block) for s in body.sites] == [(4, 2, 8, i) for i in range(3)]
    assert [b.module for b in body.blocks] == list(model.decoder.layers)
    assert all(b.adds is True and b.mlp is model.decoder.layers[i].ffn for i, b in enumerate(body.blocks))
    assert body.final_norm is model.decoder.final_norm and body.unembed is model.lm_head and body.embed is model.embed
    z = torch.randn(2, 4, 8)
    w = model.decoder.layers[1].self_attn.w_o.weight
    want = torch.stack([z[:, h] @ w[:, h * 8 : (h + 1) * 8].T for h in range(4)], 1)  # z_h W_O^h, head by head
    torch.testing.assert_close(body.sites[1].head_outputs(z), want)


def test_post_norm_blocks_are_said_so_and_dla_refuses_them():
    model = _lm(norm_first=False)
    assert [b.adds for b in A.anatomy(model).blocks] == [False] * 3
    with pytest.raises(ValueError, match="post-norm or sandwich-normed"):
        P.direct_logit_attribution(model, torch.randint(0, 50, (1, 6)), answer=1, wrong=2)


def test_the_parts_of_a_pre_norm_lm_add_up_to_its_logits():
    model = _lm()
    ids = torch.randint(0, 50, (1, 7), generator=torch.Generator().manual_seed(1))
    out = P.direct_logit_attribution(model, ids, answer=3, wrong=4)
    assert abs(out["check"]["sum_of_parts"] - out["check"]["logit_difference"]) < 1e-4
    lens = P.logit_lens(model, ids)
    with torch.no_grad():
        torch.testing.assert_close(lens[-1], model(ids), atol=1e-5, rtol=1e-5)


class _Toy(nn.Module):
    """A model multihead knows nothing of, around multihead's attention modules: a source describes it."""

    def __init__(self) -> None:
        super().__init__()
        from multihead.modules.attention import MultiHeadAttention

        self.inner = nn.ModuleList([MultiHeadAttention(16, 2) for _ in range(2)])

    def forward(self, x):
        for a in self.inner:
            x = x + a(x, need_weights=False)[0]
        return x


def test_a_source_plugs_in_at_one_place():
    toy = _Toy()
    picked = []

    def toy_source(model):
        if not isinstance(model, _Toy):
            return None
        picked.append(model)
        sites, blocks = A.blocks_of(model, [(f"inner.{i}", a) for i, a in enumerate(model.inner)], lambda b: None)
        return A.Anatomy("toy", model, tuple(sites), tuple(blocks), None, None, None)

    A.SOURCES.pop("native")  # the toy source alone first: then the native one again
    A.register_source("toy", toy_source)
    try:
        with capture(toy) as cache:
            toy(torch.randn(1, 5, 16))
        assert picked == [toy] and [p.shape for p in cache.patterns()] == [(1, 2, 5, 5)] * 2
        assert all(s.block is None for s in A.anatomy(toy).sites)
    finally:
        A.SOURCES.pop("toy")
        A.register_source("native", A._native)
    assert A.anatomy(toy).source == "native"


def test_a_model_with_no_attention_is_refused_with_what_works():
    with pytest.raises(ValueError, match="no multihead MultiHeadAttention modules.*multihead.hf.attach"):
        A.anatomy(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
