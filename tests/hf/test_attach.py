"""multihead.hf.attach on 33 HF architectures built from small configs (random weights, no download), under the
installed transformers (5.24.0 in .venv, 4.57.6 in .venv-hf4: `make test` runs this file in both).

For every architecture that routes attention through HF's registry: attached outputs equal HF's own; every
``hook_pattern`` equals HF eager's ``output_attentions``; the exact statistics equal those of the patterns; a head
patched with its own activation changes nothing; zero-ablating a head equals zeroing its slice of the output
projection's input by hand; on GQA models, editing one key/value head changes only the query heads that share it.
An architecture whose layers compute attention without the registry is refused by the registry with its attention
class named (only those expected to be), and attached by observation instead (multihead.modules.observe), where the
same checks hold."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf  # noqa: E402
from multihead.interpret.causal.patching import ablated, activation_patching, attribution_patching  # noqa: E402
from multihead.modules import capture  # noqa: E402
from multihead.modules.observe import BY_HAND  # noqa: E402

from .archs import ARCHS  # noqa: E402

MAJOR = int(transformers.__version__.split(".")[0])
# What each transformers line computes outside its attention registry (their attention classes say so in source):
# the registry refuses them, observation serves them.
BYPASS = {
    4: {"stablelm", "falcon", "gptj", "bloom", "bert", "roberta", "distilbert", "electra", "t5"},
    5: {"falcon", "bloom"},
}[MAJOR]
ATTACHED = sorted(ARCHS)


def _hf_attentions(out) -> list[torch.Tensor]:
    """Every attention map an HF output holds (encoder, decoder, cross, both CLIP towers)."""
    found = []
    for key, value in out.items():
        if "attentions" in key and isinstance(value, tuple):
            found += [t for t in value if isinstance(t, torch.Tensor)]
        elif hasattr(value, "items"):
            found += _hf_attentions(value)
    return found


@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = ARCHS[name].build()
        return cache[name]

    return get


def test_the_registry_refuses_the_expected_architectures_and_observation_serves_them(built):
    for name in sorted(ARCHS):
        model = built(name)
        why = hf.why_not(model, source="registry")
        assert (why is not None) == (name in BYPASS), name
        if why is None:
            continue
        assert "attention registry" in why and "Attention" in why  # the class that bypasses it is named
        with pytest.raises(hf.AttachError, match="computes attention itself"):
            hf.attach(model, source="registry")
        assert not hf.is_attached(model)
        assert hf.why_not(model) is None  # the default source: the registry, else observation
        att = hf.attach(model)
        try:
            assert att.source == "observed" and att.why_observed == why
            assert {rec.source for rec in att.layers.values()} == {"observed"}
        finally:
            hf.detach(model)


@pytest.mark.parametrize("name", ATTACHED)
def test_attached_matches_hf(name, built):
    arch, model = ARCHS[name], built(name)
    x = arch.inputs()
    with torch.no_grad():
        ref = arch.tensor(arch.run(model, x))
    att = hf.attach(model)
    try:
        assert att.layers, name
        with torch.no_grad():
            out = arch.tensor(arch.run(model, x))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)

        assert att.source == ("observed" if name in BYPASS else "registry")
        # patterns and statistics, against HF eager's output_attentions on the same weights (attention an observed
        # model writes by hand gives no statistics: the observer refuses them by name)
        by_hand = att.observed is not None and any(s.func is BY_HAND for s in att.observed.sites)
        with capture(model, ("pattern",) if by_hand else ("pattern", "stats")) as cache, torch.no_grad():
            arch.run(model, x)
        ours = cache.patterns()
        eager = ARCHS[name].build("eager")
        with torch.no_grad():
            theirs = _hf_attentions(arch.run(eager, x, output_attentions=True))
        assert len(theirs) == len(ours), (len(theirs), len(ours))
        unused = list(range(len(theirs)))
        for i, p in enumerate(ours):
            match = next(
                (j for j in unused if theirs[j].shape == p.shape and torch.allclose(theirs[j], p, atol=1e-5)), None
            )
            assert match is not None, f"{name}: {list(att.layers)[i]} has no equal HF pattern"
            unused.remove(match)
            if by_hand:
                continue
            st = cache.stats(i)
            ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
            torch.testing.assert_close(st.entropy, ent, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(st.received, p.sum(-2), atol=1e-4, rtol=1e-4)
            top = p.topk(min(3, p.shape[-1]), -1).values
            torch.testing.assert_close(st.topk_weight[..., : top.shape[-1]], top, atol=1e-5, rtol=1e-5)

        # a head patched with its own activation changes nothing
        def run(m, inputs):
            return arch.tensor(arch.run(m, inputs))

        def metric(t):
            return t.flatten(1)[:, :16].sum(-1)

        r = activation_patching(model, x, x, metric, run=run)
        assert r["effect"].abs().max() < 1e-5, name
        a = attribution_patching(model, x, x, metric, run=run)
        assert a["effect"].abs().max() < 1e-6

        # zero-ablating head 1 of the first attention layer = zeroing its columns of the output projection's input
        first = att.layers[next(iter(att.layers))]
        d = first.head_dim
        with ablated(model, {0: [1]}), torch.no_grad():
            ablated_out = run(model, x)

        def zero_slice(mod, args):
            t = args[0].clone()
            t[..., d : 2 * d] = 0
            return (t, *args[1:])

        handle = first.out_proj.register_forward_pre_hook(zero_slice)
        try:
            with torch.no_grad():
                by_hand = run(model, x)
        finally:
            handle.remove()
        torch.testing.assert_close(ablated_out, by_hand, atol=1e-6, rtol=1e-6)
        assert (ablated_out - out).abs().max() > 1e-6  # the ablation did something
    finally:
        hf.detach(model)
    assert not any(n.endswith("hook_z") for n, _ in model.named_modules())
    with torch.no_grad():
        torch.testing.assert_close(arch.tensor(arch.run(model, x)), ref, atol=0, rtol=0)


# (observation sees key/value heads as the call gets them: a layer that repeats them before SDPA shows no groups)
@pytest.mark.parametrize("name", [n for n in ATTACHED if ARCHS[n].gqa and n not in BYPASS])
def test_gqa_key_patching_touches_only_the_heads_sharing_it(name, built):
    arch, model = ARCHS[name], built(name)
    x, other = arch.inputs(0), arch.inputs(1)
    att = hf.attach(model)
    try:
        layer = att.layers[next(iter(att.layers))]
        h, g = layer.num_heads, layer.num_kv_heads
        assert g < h
        with capture(model, ("k", "z"), layers=[0]) as donor, torch.no_grad():
            arch.run(model, other)
        with capture(model, ("z",), layers=[0]) as clean, torch.no_grad():
            arch.run(model, x)
        shared = 1  # key/value head 1 of layer 0 taken from the other input
        handle = layer.hook_k.add_hook(
            lambda k, hook: torch.cat([k[:, :shared], donor.get_layer("k", 0)[:, 1:2], k[:, 2:]], 1)
        )
        try:
            with capture(model, ("z",), layers=[0]) as patched, torch.no_grad():
                arch.run(model, x)
        finally:
            handle.remove()
        per = h // g
        group = range(shared * per, (shared + 1) * per)
        zc, zp = clean.get_layer("z", 0), patched.get_layer("z", 0)
        for head in range(h):
            changed = (zc[:, head] - zp[:, head]).abs().max() > 1e-6
            assert changed == (head in group), (name, head, list(group))
    finally:
        hf.detach(model)


def test_hostile_attach_calls(built):
    model = built("llama")
    hf.attach(model)
    try:
        with pytest.raises(hf.AttachError, match="already attached"):
            hf.attach(model)
    finally:
        hf.detach(model)
    with pytest.raises(hf.AttachError, match="not attached"):
        hf.detach(model)
    with pytest.raises(hf.AttachError, match="not an HF transformers model"):
        hf.attach(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="backend"):
        hf.attach(model, backend="nonsense")
    with pytest.raises(hf.AttachError, match="unknown attach source 'nonsense'; one of auto, registry, observed"):
        hf.attach(model, source="nonsense")
    with pytest.raises(hf.AttachError, match="unknown attach source"):
        hf.why_not(model, source="nonsense")
    assert not hf.is_attached(model)


def test_a_custom_attention_class_is_refused_by_name(built):
    """A user's own attention module whose softmax the observer cannot split into heads would be invisible: attach
    refuses the model, naming it, through either source."""
    model = ARCHS["llama"].build()

    class MyAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.o = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, hidden_states, **kw):
            return self.o(torch.softmax(self.q(hidden_states), -1)), None

    model.model.layers[1].self_attn = MyAttention()
    with pytest.raises(hf.AttachError, match=r"MyAttention \(model.layers.1.self_attn\) made no attention call the"):
        hf.attach(model)
    with pytest.raises(hf.AttachError, match=r"MyAttention \(model.layers.1.self_attn\)"):
        hf.attach(model, source="registry")
    assert not hf.is_attached(model) and not any(n.endswith("hook_z") for n, _ in model.named_modules())
    assert model.config._attn_implementation != hf.NAME


def test_capture_of_resid_and_block_hooks(built):
    arch, model = ARCHS["llama"], built("llama")
    x = arch.inputs()
    att = hf.attach(model)
    try:
        seen = {}
        block = model.model.layers[0]
        for hook in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out"):
            getattr(block, hook).add_hook(lambda t, h, hook=hook: seen.__setitem__(hook, t))
        with torch.no_grad():
            arch.run(model, x)
        torch.testing.assert_close(seen["hook_resid_pre"] + seen["hook_attn_out"], seen["hook_resid_mid"])
        torch.testing.assert_close(seen["hook_resid_mid"] + seen["hook_mlp_out"], seen["hook_resid_post"])
        for hook in list(seen):
            getattr(block, hook)._forward_hooks.clear()
        # an edit through hook_resid_pre reaches the output
        block.hook_resid_pre.add_hook(lambda t, h: t * 0)
        with torch.no_grad():
            zeroed = arch.tensor(arch.run(model, x))
        block.hook_resid_pre._forward_hooks.clear()
        with torch.no_grad():
            plain = arch.tensor(arch.run(model, x))
        assert (zeroed - plain).abs().max() > 1e-4
        with capture(model, ("resid",)) as cache, torch.no_grad():
            arch.run(model, x)
        assert cache.get_layer("resid", 1).shape == (1, 10, 64)
        assert att.blocks == ["model.layers.0", "model.layers.1"]
    finally:
        hf.detach(model)


# Defined from a string: no source file for inspect or transformers to read. The attention class calls the registry
# only through a helper (LlamaAttention.forward, reached by an alias), the model class is a subclass made in exec.
_STRING_CLASSES = """
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaForCausalLM
_through = LlamaAttention.forward

def _helper(module, *args, **kwargs):
    return _through(module, *args, **kwargs)

class ViaHelperAttention(LlamaAttention):
    def forward(self, *args, **kwargs):
        return _helper(self, *args, **kwargs)

class StringLlama(LlamaForCausalLM):
    pass
"""


def test_layers_are_found_by_observation_through_a_helper_and_without_source():
    import inspect

    space: dict = {"__name__": "multihead_test_string_module"}
    exec(compile(_STRING_CLASSES, "<string>", "exec"), space)  # noqa: S102  (the test's own text)
    for cls in (space["ViaHelperAttention"], space["StringLlama"]):
        with pytest.raises((OSError, TypeError)):  # no source to read
            inspect.getsource(cls)
    arch = ARCHS["llama"]
    torch.manual_seed(0)
    model = space["StringLlama"](arch._config(transformers)).eval()
    for layer in model.model.layers:
        layer.self_attn.__class__ = space["ViaHelperAttention"]
    x = arch.inputs()
    with torch.no_grad():
        ref = model(input_ids=x[0]).logits
    att = hf.attach(model)
    try:
        assert list(att.layers) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
        first = att.layers["model.layers.0.self_attn"]
        assert (first.num_heads, first.num_kv_heads, first.head_dim) == (4, 2, 16)  # from the observed tensors
        with capture(model, ("pattern",)) as cache, torch.no_grad():
            out = model(input_ids=x[0]).logits
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        # the pattern is the softmax of the hooked queries and keys, written out here
        with capture(model, ("q", "k")) as qk, torch.no_grad():
            model(input_ids=x[0])
        q, k = qk.get_layer("q", 0), qk.get_layer("k", 0).repeat_interleave(2, dim=1)
        s = (q @ k.transpose(-1, -2)) / 4.0
        s = s.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(cache.patterns()[0], torch.softmax(s, -1), atol=1e-5, rtol=1e-5)
    finally:
        hf.detach(model)
    assert model.config._attn_implementation != hf.NAME


def test_the_probe_pass_leaves_no_trace_and_a_bad_probe_names_example(built):
    model = built("llama")
    model.train()
    model.model.layers[0].eval()  # mixed training flags come back as they were
    state = torch.random.get_rng_state()
    seen = []
    handle = model.model.layers[0].register_forward_hook(lambda *a: seen.append(1))
    try:
        from multihead.hf.attach import observe

        layers = observe(model)
        assert [n for n, *_ in layers] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
        assert torch.equal(torch.random.get_rng_state(), state)  # no dropout drew from the generator
        assert model.training and not model.model.layers[0].training and model.model.layers[1].training
        assert model.config._attn_implementation not in (hf.NAME, "multihead_probe")
        assert len(seen) == 1  # the user's hook saw the one probe pass
    finally:
        handle.remove()
        model.eval()
    with pytest.raises(hf.AttachError, match=r"pass example="):
        hf.attach(model, example={"input_ids": torch.tensor([[10_000]])})
    assert not hf.is_attached(model)
    assert model.config._attn_implementation not in (hf.NAME, "multihead_probe")
    att = hf.attach(model, example={"input_ids": torch.tensor([[1, 2]])})
    assert len(att.layers) == 2
    hf.detach(model)


def test_routes_is_deprecated_and_still_answers():
    from transformers.models.llama.modeling_llama import LlamaAttention

    from multihead.hf.attach import routes

    with pytest.warns(DeprecationWarning, match="observe"):
        assert routes(LlamaAttention)
