"""Shared by the variant tests: a small causal LM with one attention option set, and its logits decoded step by
step through the KV cache (to compare with one full forward pass)."""

import torch

from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig
from multihead.modules.variants import AttentionConfig


def small_lm(seed: int, positional: str = "rope", *, layers: int = 2, max_len: int = 32, **option) -> CausalLM:
    """d_model 32, 4 heads, pre-LN, vocabulary 50, in eval mode; ``option``: AttentionConfig fields (gate=True,
    ...)."""
    torch.manual_seed(seed)
    dec = DecoderConfig(
        d_model=32,
        num_heads=4,
        num_layers=layers,
        d_ff=64,
        dropout=0.0,
        cross_attention=False,
        norm_first=True,
        attention=AttentionConfig(**option),
    )
    return CausalLM(CausalLMConfig(vocab_size=50, max_len=max_len, positional=positional, decoder=dec)).eval()


@torch.no_grad()
def stepwise(lm: CausalLM, ids: torch.Tensor, prefix: int) -> tuple[torch.Tensor, object]:
    """``(logits (B, T, V), cache)``: the first ``prefix`` tokens in one call, then one token per call, all through
    one KV cache."""
    cache = lm.new_cache()
    steps = [lm(ids[:, :prefix], cache=cache)] + [
        lm(ids[:, t : t + 1], cache=cache) for t in range(prefix, ids.shape[1])
    ]
    return torch.cat(steps, 1), cache


@torch.no_grad()
def randomise_sinks(lm: CausalLM) -> CausalLM:
    """Every layer's learned sink logits drawn from N(0, 1) (they start at 0), so that tests see them act."""
    for layer in lm.decoder.layers:
        layer.self_attn.sink_logits.normal_()
    return lm
