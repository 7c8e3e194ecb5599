"""A decoding step with nothing but its arithmetic, for the causal LMs whose layers need nothing else.

A step of :class:`~multihead.models.seq2seq.CausalLM` through the general path builds masks, asks the attention
registry for a backend, fires a dozen hook points per layer and speaks the cache protocol -- about two thousand
small operations and Python calls a step, which on a 135M-parameter model cost as much as a third of the weights'
streaming. :func:`step` runs the same layers' own modules (their norms, projections, feed-forward, rotary and
cache) with none of that: per layer one norm, one q/k/v product, the rotation, the cache write, one attention call,
the output projection, one norm and the feed-forward. It gives the general path's logits (within the order of
additions inside a product) and the same greedy tokens.

:func:`why_not` says when it does not apply, and :meth:`CausalLM.step` then takes the general path: gradients on,
training mode, hooks attached (an intervention or a capture must see every hook point fire), a KV policy or a
streaming cache, padded rows, or a layer the step does not know (cross-attention, sliding windows, ALiBi, sinks,
gated, differential or talking-heads attention, MLA, post-norm blocks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention.registry import get_backend
from ..modules import fastpath
from ..modules.attention import MultiHeadAttention
from ..modules.hooks import HookPoint
from ..modules.kv_cache import KVCache, LayerKV

ENABLED = True


def _architecture(model) -> str | None:
    """Why the step cannot run ``model``'s layers (None: it can); decided once per model."""
    c = model.config
    d = c.decoder
    if d.cross_attention or not d.causal:
        return "the decoder has cross-attention or reads both ways"
    if not d.norm_first or d.sandwich_norm:
        return "its blocks normalise after each sublayer (post-norm or sandwich norms)"
    if d.sliding_window is not None or d.attention.alibi or c.positional == "alibi":
        return "it has sliding-window layers or ALiBi"
    for i, layer in enumerate(model.decoder.layers):
        a = layer.self_attn
        if type(a) is not MultiHeadAttention:
            return f"layer {i}'s attention is {type(a).__name__}, not plain multi-head attention"
        if a.num_heads == 0 or a.w_gate is not None or a.sink_logits is not None or a.pattern is not None:
            return f"layer {i}'s attention has no heads, a gate, sinks or a sparsity pattern"
        if layer.post_norms is not None:
            return f"layer {i} normalises its sublayers' outputs"
        if a.backend != "auto" and not get_backend(a.backend).capabilities.exact:
            return f"layer {i} attends with the approximate {a.backend!r} backend"
    return None


def why_not(model, cache: KVCache) -> str | None:
    """Why :func:`step` does not serve this step of ``model`` with ``cache`` (None: it does)."""
    if not ENABLED:
        return "fast_decode.ENABLED is False"
    if torch.is_grad_enabled() or model.training:
        return "gradients are on or the model is training"
    known = model.__dict__.get("_fast_step")
    if known is None:
        hooks = [m for m in model.modules() if isinstance(m, HookPoint)]
        known = model.__dict__["_fast_step"] = (_architecture(model), hooks)
    reason, hooks = known
    if reason is not None:
        return reason
    if any(h._forward_hooks or h._forward_pre_hooks for h in hooks):
        return "hooks are attached (a capture or an intervention must see every hook point)"
    if cache.policy is not None or any(type(kv) is not LayerKV for kv in cache.self_attn):
        return "the cache follows a KV policy or streams (its protocol decides what each layer attends)"
    if cache.key_padding is not None or cache.next_position is None:
        return "the rows are padded, or the cache holds no prompt yet"
    limit = model.config.max_len
    if int(cache.next_position.max()) >= limit and (model.config.positional != "rope" or not cache.extrapolate):
        return f"the next position is past the model's {limit}: the general path says what to do"
    return None


def step(model, tokens: Tensor, cache: KVCache) -> Tensor:
    """One token per row ``(B,)`` in, its logits ``(B, V)`` out; the cache extended. Call only where
    :func:`why_not` says None (:meth:`CausalLM.step` does)."""
    dec = model.decoder
    pos = cache.next_position  # (B,)
    positions = pos[:, None]  # (B, 1): one tensor for every layer, so the rotary angles are computed once
    x = model.embed(tokens[:, None])  # (B, 1, E)
    if model.config.embed_scale:
        x = x * torch.tensor(dec.config.d_model**0.5, dtype=x.dtype)
    if model.pos is not None:
        x = model.pos(x, positions=positions)
    b = x.shape[0]
    for layer, kv in zip(dec.layers, cache.self_attn):
        a = layer.self_attn
        h = layer.norms[0](x)
        q, k, v = a._project(h, h, h, None)  # (B, H, 1, D), (B, G, 1, D)
        if a.rotary is not None:
            q, k = a.rotary.rotate_pair(q, k, 0, positions)
        k, v = kv.append(k, v)  # written in place into the cache's buffers: (B, G, L, D)
        z = F.scaled_dot_product_attention(q, k, v, enable_gqa=a.num_kv_heads != a.num_heads)  # (B, H, 1, D)
        x = x + a.w_o(z.transpose(1, 2).reshape(b, 1, a.num_heads * a.head_dim))
        if layer.ffn is not None:
            x = x + layer.ffn(layer.norms[1](x))
    if dec.final_norm is not None:
        x = dec.final_norm(x)
    cache.next_position = pos + 1
    return fastpath.linear(x, model.lm_head.weight, None, model.lm_head)[:, -1]  # (B, V)


__all__ = ["ENABLED", "step", "why_not"]
