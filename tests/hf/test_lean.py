"""An attached HF causal LM decoded through multihead's own step over HF's own weights (`multihead.hf.lean`):
HF's ``generate``'s tokens with none of HF's layers run, no weight copied, and HF's layers wherever something must
see them (hooks, another family, a sliding window), mid-generation too."""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf  # noqa: E402
from multihead.hf import lean  # noqa: E402
from multihead.hf.folder import AttachedLM  # noqa: E402
from multihead.models import fast_decode  # noqa: E402
from multihead.models.generation import generate  # noqa: E402

from .archs import ARCHS  # noqa: E402

NEW = 20


def _build(name: str, **config):
    arch = ARCHS[name]
    return dataclasses.replace(arch, config={**arch.config, **config}).build()


def _hf_tokens(model, ids) -> list[int]:
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, ids.shape[1] :].tolist()


def _ids(seed: int = 0, length: int = 12) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(seed))


class _LayerCalls:
    """Counts the calls of the HF model's decoder layers (its class's forward, patched: no hook)."""

    def __init__(self, model, monkeypatch):
        self.n = 0
        cls = type(model.model.layers[0])
        own = cls.forward

        def forward(layer, *args, **kwargs):
            self.n += 1
            return own(layer, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", forward)


def _ours(model, ids, **kw) -> list[int]:
    with torch.no_grad():
        return generate(AttachedLM(model, 0), ids, max_new_tokens=NEW, **kw).tokens[0]


LEAN = [
    ("llama", {}),
    ("mistral", {"sliding_window": None}),
    ("qwen2", {}),  # biases on q, k and v
    ("qwen3", {}),  # q and k norms, a head size of its own
]


@pytest.mark.parametrize(("name", "config"), LEAN, ids=[n for n, _ in LEAN])
def test_an_attached_model_of_a_family_multihead_reads_decodes_through_multihead_step(name, config, monkeypatch):
    model = _build(name, **config)
    ids = _ids()
    want = _hf_tokens(model, ids)
    with torch.no_grad():
        hf_logits = model(input_ids=ids).logits[0, -1]
    hf.attach(model)
    assert lean.why_not_view(model) is None
    calls = _LayerCalls(model, monkeypatch)
    assert _ours(model, ids) == want
    assert calls.n == 0  # neither the prompt nor a step ran HF's layers
    with torch.no_grad():
        logits, cache = AttachedLM(model, 0).prefill(ids)
    torch.testing.assert_close(logits[0], hf_logits, atol=1e-4, rtol=1e-4)
    assert type(cache).__name__ == "KVCache" and cache.length == ids.shape[1]


def test_the_view_holds_the_hf_models_own_parameters_and_reads_their_edits():
    model = _build("llama")
    hf.attach(model)
    native = lean.view(model)
    theirs = {id(p) for p in model.parameters()}
    assert {id(p) for p in native.parameters()} <= theirs  # the same objects: nothing copied
    assert native.decoder.layers[1].self_attn.w_v.weight is model.model.layers[1].self_attn.v_proj.weight
    ids = _ids(1)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)  # an edit in place, after the view was built
    edited = _ours(model, ids)
    lean.ENABLED = False
    try:
        assert _ours(model, ids) == edited  # HF's layers over the edited weights write the same tokens
    finally:
        lean.ENABLED = True
    assert lean.view(model) is native  # the same parameters: the view is kept


def test_a_replaced_module_rebuilds_the_view_over_its_new_parameters():
    model = _build("llama")
    hf.attach(model)
    first = lean.view(model)
    old = model.model.layers[0].mlp.up_proj
    new = torch.nn.Linear(old.in_features, old.out_features, bias=False)
    torch.nn.init.normal_(new.weight, std=0.02)  # as HF initialises it
    model.model.layers[0].mlp.up_proj = new
    second = lean.view(model)
    assert second is not first
    assert second.decoder.layers[0].ffn.w_1.weight is new.weight
    lean.ENABLED = False
    try:
        through_hf = _ours(model, _ids(2))
    finally:
        lean.ENABLED = True
    assert _ours(model, _ids(2)) == through_hf


def test_hooks_send_the_generation_to_hf_layers_from_the_step_they_appear(monkeypatch):
    model = _build("llama")
    ids = _ids(3)
    want = _hf_tokens(model, ids)
    hf.attach(model)
    fired = []
    layer = model.model.layers[1]

    def add_hook(tokens, alive):  # after the 5th token: a hook appears while the generation runs
        if len(fired) == 0 and add_hook.seen == 4:
            layer.register_forward_hook(lambda m, a, out: fired.append(1))
        add_hook.seen += 1

    add_hook.seen = 0
    with torch.no_grad():
        got = generate(AttachedLM(model, 0), ids, max_new_tokens=NEW, streamer=add_hook).tokens[0]
    assert got == want  # the rest read the same cache through HF's layers
    assert len(fired) == NEW - 5  # every step after the hook appeared ran HF's layer 1
    with torch.no_grad():
        assert "hooks" in lean.why_not(model)
    calls = _LayerCalls(model, monkeypatch)
    assert _ours(model, ids) == want
    assert calls.n == 2 * NEW  # hooked from the start: HF's 2 layers at the prompt and every step


@pytest.mark.parametrize(
    ("name", "config", "reason"),
    [
        ("mistral", {"sliding_window": 4}, "sliding-window"),
        ("gpt_neox", {}, "gpt_neox"),
        ("gpt2", {}, "converting its weights"),
    ],
)
def test_a_model_the_view_cannot_serve_decodes_through_hf_layers(name, config, reason, monkeypatch):
    model = _build(name, **config)
    ids = _ids(4)
    want = _hf_tokens(model, ids)
    hf.attach(model)
    assert reason in lean.why_not_view(model)
    with pytest.raises(ValueError, match="has no multihead view"):
        lean.view(model)
    assert _ours(model, ids) == want


def test_gradients_on_keep_hf_layers():
    model = _build("llama")
    hf.attach(model)
    with torch.enable_grad():
        assert "gradients" in lean.why_not(model)
    with torch.no_grad():
        assert lean.why_not(model) is None


@pytest.mark.skipif(fast_decode.why_not_inductor() is not None, reason="no C++ compiler for inductor here")
@pytest.mark.parametrize("whole_step", [False, True])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_an_attached_model_compiles_through_its_view_and_writes_hf_tokens(name, whole_step, monkeypatch):
    """fast_decode.compile on an attached model compiles multihead's view over HF's own weights: HF generate's
    tokens, none of HF's layers run, nothing copied."""
    model = _build(name)
    ids = _ids(3)
    want = _hf_tokens(model, ids)
    hf.attach(model)
    attached = AttachedLM(model, 0)
    assert fast_decode.compile(attached, whole_step=whole_step) is attached
    assert fast_decode.compiled(attached) and fast_decode.decoding_model(attached) is lean.view(model)
    calls = _LayerCalls(model, monkeypatch)
    with torch.no_grad():
        assert generate(attached, ids, max_new_tokens=NEW).tokens[0] == want
    assert calls.n == 0 and fast_decode.chosen(lean.view(model)).note == "fast_decode.compile was called"
    own = {id(p) for p in model.parameters()}
    assert all(id(p) in own for p in lean.view(model).parameters())  # the graphs read HF's parameter objects
