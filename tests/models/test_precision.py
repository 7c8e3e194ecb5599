"""Weights stored in bf16 or int8 for decoding (:mod:`multihead.models.precision`): each product is its format's
formula; a converted model decodes exactly as a float32 model holding the values the format stores (the lean step,
the general path and every KV policy alike), a quarter or half of the bytes; what the path cannot serve is refused
with the reason, before anything is read."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from multihead.loading import load
from multihead.models import fast_decode, kernels
from multihead.models.generation import generate
from multihead.models.precision import WeightOnlyLinear, convert, weight_only, why_not
from multihead.models.seq2seq import Seq2Seq, Seq2SeqConfig

from test_decoding_layout import SHAPES, _decode, _decode_batch, _model


def test_each_format_multiplies_as_its_formula():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(3, 5, 64)
    q = WeightOnlyLinear(linear, "int8")
    scales = linear.weight.detach().abs().amax(1) / 127
    stored = (linear.weight.detach() / scales[:, None]).round().clamp(-127, 127)
    assert torch.equal(q.qweight, stored.to(torch.int8)) and torch.allclose(q.scales, scales)
    torch.testing.assert_close(q(x), F.linear(x, stored * scales[:, None], linear.bias), rtol=1e-5, atol=1e-6)
    b = WeightOnlyLinear(linear, "bf16")
    want = F.linear(x.bfloat16().double(), linear.weight.detach().bfloat16().double()).bfloat16().float()
    ulp = want.abs() * 2**-7  # the result is rounded to bfloat16 once: within one unit of its last place
    assert ((b(x) - linear.bias.detach() - want).abs() <= ulp + 1e-6).all()
    assert q.qweight.element_size() == 1 and b.qweight.element_size() == 2


def _dequantised(model, converted):
    """A float32 copy of ``model`` holding, in every converted layer, the values the format stores."""
    ref = copy.deepcopy(model)
    stored = {n: m.weight for n, m in converted.named_modules() if isinstance(m, WeightOnlyLinear)}
    for name, m in ref.named_modules():
        if name in stored:  # a new parameter: a head tied to the embedding is untied, as convert unties it
            m.weight = torch.nn.Parameter(stored[name].clone(), requires_grad=False)
    return ref


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_a_converted_model_decodes_as_float32_holding_the_stored_values(name, fmt):
    model = _model(name)
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    q = convert(copy.deepcopy(model), fmt)
    assert weight_only(q) == fmt and weight_only(model) is None
    logits, tokens = _decode(q, ids)
    if fmt == "int8":  # float32 activations: the same numbers as float32 over the stored values
        ref_logits, ref_tokens = _decode(_dequantised(model, q), ids)
        assert tokens == ref_tokens
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # the general path (a hook on) writes the same as the lean step
        handle = q.decoder.layers[0].register_forward_hook(lambda *a: None)
        general = _decode(q, ids)
        handle.remove()
    assert general[1] == tokens
    if fmt == "int8":
        torch.testing.assert_close(general[0], logits, rtol=1e-4, atol=1e-4)
    else:  # bf16's head rounds each logit to bfloat16: within two units of the last place of the row's largest
        assert ((general[0] - logits).abs() <= 2**-7 * logits.abs().amax(-1, keepdim=True)).all()
    assert fast_decode.chosen(q).kernel == "library"  # the suite asks for the library's product (conftest)


@pytest.mark.skipif(kernels.why_not_inductor() is not None, reason=f"no inductor here: {kernels.why_not_inductor()}")
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_inductors_reduction_over_the_stored_weights_writes_the_librarys_tokens(fmt, monkeypatch, tmp_path):
    """Where the measurement picks inductor's reduction (asked for here), a row takes it: float32 activations and
    accumulation over the stored values (the product against that formula); int8's decoding is then the library's
    (whose activations are float32 too) up to the order of additions. bf16's library rounds the activation to bf16,
    the reduction does not: there the product's formula is the check."""
    model = _model("llama")
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    library = _decode(convert(copy.deepcopy(model), fmt), ids)
    batch = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(2))
    library_rows, _ = _decode_batch(convert(copy.deepcopy(model), fmt), batch)
    monkeypatch.setenv(kernels.ENV, "compiled")
    q = convert(copy.deepcopy(model), fmt)
    logits, tokens = _decode(q, ids)
    assert fast_decode.chosen(q).kernel == "compiled" and {m.kernel for m in _stored(q)} == {"compiled"}
    layer = _stored(q)[0]
    with torch.no_grad():
        for rows in (1, 3, 5):  # one row, then batches: one graph with the rows symbolic serves both
            x = torch.randn(rows, layer.in_features)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    if fmt == "int8":
        assert tokens == library[1]
        torch.testing.assert_close(logits, library[0], rtol=1e-4, atol=1e-4)
        rows = convert(copy.deepcopy(model), fmt)  # a batch first: its rows take the product measured for one
        got, _ = _decode_batch(rows, batch)
        assert {m.kernel for m in _stored(rows)} == {"compiled"}
        assert torch.equal(got.argmax(-1), library_rows.argmax(-1))
        torch.testing.assert_close(got, library_rows, rtol=1e-4, atol=1e-4)


def _stored(model):
    return [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]


@pytest.mark.parametrize("policy", ["h2o", "snapkv", "window"])
def test_every_kv_policy_still_serves_a_converted_model(policy):
    model = _model("llama")
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    q = convert(copy.deepcopy(model), "int8")
    ref = _dequantised(model, q)
    got = generate(q, ids, max_new_tokens=10, kv_policy=policy, kv_budget=16).tokens
    assert got == generate(ref, ids, max_new_tokens=10, kv_policy=policy, kv_budget=16).tokens


def test_what_the_path_cannot_serve_is_refused_with_the_reason(tmp_path):
    model = _model("llama")
    with pytest.raises(ValueError, match="unknown dtype 'fp8': choose one of fp32, bf16, int8"):
        convert(model, "fp8")
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):  # checked before the source is read
        load(tmp_path / "nothing-here", dtype="fp8")
    seq = Seq2Seq(Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=20))
    assert "not one of multihead's causal LMs" in why_not(seq, "int8")


@pytest.mark.skipif(kernels.why_not_inductor() is not None, reason=f"no inductor here: {kernels.why_not_inductor()}")
@pytest.mark.parametrize("whole_step", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_the_compiled_steps_read_the_stored_weights_as_float32_holding_their_values(fmt, whole_step):
    """The compiled steps (per layer and whole) upcast the stored weights inside their reductions and scale each row:
    each step's logits are those of a float32 model holding the values the format stores (the head included: tied in
    the model, untied and stored in the format by convert), from the same cache, across a cache that doubles; the
    stored weights are read where they are, never copied."""
    model = _model("llama")
    ids = torch.randint(3, 300, (1, 70), generator=torch.Generator().manual_seed(3))
    q = convert(copy.deepcopy(model), fmt)
    assert isinstance(q.lm_head, WeightOnlyLinear) and q.embed.weight.dtype == torch.float32
    ref = _dequantised(model, q)
    stored = [m.qweight.data_ptr() for m in _stored(q)]
    fast_decode.compile(q, whole_step=whole_step)
    with torch.no_grad():
        logits, cache = q.prefill(ids)  # the library's product (a batch of rows): both sides start from it
        ref_cache = copy.deepcopy(cache)
        for _ in range(80):
            tok = logits.argmax(-1)
            logits, want = q.step(tok, cache), ref.step(tok, ref_cache)
            torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
    assert cache.length == ref_cache.length == 150
    assert fast_decode.chosen(q).note == "fast_decode.compile was called"  # the compiled step served every step
    assert fast_decode.compiled(q) and [m.qweight.data_ptr() for m in _stored(q)] == stored


def test_the_head_may_stay_float32_and_tied():
    model = _model("llama")
    q = convert(copy.deepcopy(model), "int8", head=False)
    assert isinstance(q.lm_head, torch.nn.Linear) and q.lm_head.weight is q.embed.weight
    assert torch.equal(q.lm_head.weight, model.lm_head.weight)
    assert isinstance(convert(copy.deepcopy(model), "int8").lm_head, WeightOnlyLinear)
