"""An HF model observed at the function level (:mod:`multihead.modules.observe`) instead of attached through HF's
attention registry: the same patterns as HF eager's and the same activation patching as the attached model."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf  # noqa: E402
from multihead.interpret.causal import patching as P  # noqa: E402
from multihead.modules.anatomy import anatomy  # noqa: E402
from multihead.modules.capture import capture  # noqa: E402
from multihead.modules.observe import observe, unobserve  # noqa: E402

from .archs import ARCHS  # noqa: E402


def test_an_hf_model_observed_gives_hf_eager_attentions_and_the_attached_patching():
    """An HF Llama in its sdpa mode, observed (not attached): every pattern equals HF eager's output_attentions,
    and activation patching of every head equals that of the same model attached through HF's registry."""
    arch = ARCHS["llama"]
    model = arch.build()
    ids = arch.inputs()[0]
    with torch.no_grad():
        eager = arch.build()
        eager.set_attn_implementation("eager")
        want = eager(ids, output_attentions=True).attentions
    observe(model, ids)
    corrupt = ids.clone()
    corrupt[0, 3] = (corrupt[0, 3] + 11) % 128
    metric = P.logit_diff(5, 6)
    try:
        with torch.no_grad(), capture(model) as cache:
            model(ids)
        for got, w in zip(cache.patterns(), want):
            torch.testing.assert_close(got, w, atol=1e-6, rtol=1e-5)
        observed = P.activation_patching(model, ids, corrupt, metric)["effect"]
    finally:
        unobserve(model)
    hf.attach(model)
    try:
        attached = P.activation_patching(model, ids, corrupt, metric)["effect"]
    finally:
        hf.detach(model)
    assert observed.abs().max() > 1e-4
    torch.testing.assert_close(observed, attached, atol=1e-5, rtol=1e-4)


def _gpt2():
    import transformers as T

    cfg = T.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    return T.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")


def _bloom():
    import transformers as T

    return T.BloomForCausalLM(T.BloomConfig(vocab_size=128, hidden_size=64, n_head=4, n_layer=2))


def _gpt_neo():
    import transformers as T

    cfg = T.GPTNeoConfig(
        vocab_size=128,
        hidden_size=64,
        num_heads=4,
        num_layers=2,
        max_position_embeddings=64,
        window_size=4,
        attention_types=[[["global", "local"], 1]],
    )
    return T.GPTNeoForCausalLM(cfg)


def _xlnet():
    import transformers as T

    return T.XLNetLMHeadModel(T.XLNetConfig(vocab_size=128, d_model=64, n_head=4, n_layer=2, d_inner=128))


BY_HAND_ARCHS = {  # HF types whose layers compute attention themselves (matmul/baddbmm/einsum, softmax, matmul)
    "gpt2 (eager)": (_gpt2, lambda m: m.transformer.h[0].attn.c_proj.weight.T),
    "bloom (baddbmm, alibi)": (_bloom, lambda m: m.transformer.h[0].self_attention.dense.weight),
    "gpt_neo (local + global)": (_gpt_neo, lambda m: m.transformer.h[0].attn.attention.out_proj.weight),
    "xlnet (einsum, relative)": (_xlnet, lambda m: m.transformer.layer[0].rel_attn.o),
}


@pytest.mark.parametrize("arch", list(BY_HAND_ARCHS))
def test_hf_attention_written_by_hand_is_observed_exactly(arch):
    """HF layers that compute attention themselves (not through the registry), observed at the function level:
    every pattern equals HF's own output_attentions, nothing captured changes nothing, and zeroing a head through
    hook_z equals zeroing that head's inputs of the output projection by hand."""
    build, projection = BY_HAND_ARCHS[arch]
    torch.manual_seed(0)
    model = build().eval()
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids, output_attentions=True)
        by_hand = copy.deepcopy(model)
        w = projection(by_hand)
        if w.dim() == 3:  # XLNet's o: (width, heads, head size)
            w[:, 1] = 0
        else:
            w[:, 16:32] = 0
        want_ablated = by_hand(ids).logits
    observe(model, ids)
    try:
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, ref.logits)
            with capture(model, ("pattern",)) as cache:
                model(ids)
            site = anatomy(model).sites[0]
            handle = site.module.hook_z.add_hook(lambda z, hook: z.index_fill(1, torch.tensor([1]), 0))
            try:
                ablated = model(ids).logits
            finally:
                handle.remove()
    finally:
        unobserve(model)
    assert len(cache.patterns()) == len(ref.attentions) == 2
    for got, want in zip(cache.patterns(), ref.attentions, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ablated, want_ablated, atol=1e-5, rtol=1e-4)
    assert (ablated - ref.logits).abs().max() > 1e-4
