"""TransformerLens's ``patching`` helpers on :class:`~multihead.interpret.causal.lens.HookedTransformer`: a notebook's
``from transformer_lens import patching`` becomes ``from multihead.interpret.causal import tl_patching as patching``
and the calls stay as they were::

    clean_logits, clean_cache = model.run_with_cache(clean_tokens)
    every = patching.get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric)   # (3, layers, pos)

Each function runs the corrupted tokens once per patch, with one activation (a position, a head, or a head at a
position) taken from the clean cache, and returns the metric of each run, shaped as TransformerLens shapes it.
``metric(logits)`` returns one number (TransformerLens's metrics average over the batch). The activations are in
TransformerLens's layout (the cache of ``run_with_cache``): ``(batch, pos, d_model)`` for the residual stream and
the sub-layers' outputs, ``(batch, pos, head, d_head)`` for ``q``, ``k``, ``v`` and ``z``, ``(batch, head, query,
key)`` for the pattern.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .lens import HookedTransformer, LensCache

Metric = Callable[[Tensor], Tensor | float]


def _run(model: HookedTransformer, tokens, metric: Metric, name: str, patch: Callable[[Tensor, Tensor], Tensor], clean):
    """The metric of one run of ``tokens`` with ``name``'s activation patched from ``clean`` by ``patch``."""

    def hook(act: Tensor, hook) -> Tensor:
        return patch(act.clone(), clean)

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])
    value = metric(logits)
    return float(value.item() if isinstance(value, Tensor) else value)


def _clean(cache: LensCache, name: str) -> Tensor:
    if name not in cache:
        raise ValueError(
            f"the clean cache has no {name}: make it with model.run_with_cache(clean_tokens) (every name, or a "
            "names_filter that keeps this one)"
        )
    return cache[name]


def _by_pos(model, tokens, cache, metric, hook: str, title: str) -> Tensor:
    """(layers, pos): ``blocks.L.{hook}`` patched at one position at a time."""
    n, length = model.cfg.n_layers, tokens.shape[-1]
    out = torch.zeros(n, length)
    for layer in tqdm(range(n), desc=title, leave=False):
        name = f"blocks.{layer}.{hook}"
        clean = _clean(cache, name)
        for pos in range(length):

            def patch(act: Tensor, c: Tensor, pos=pos) -> Tensor:
                act[:, pos] = c[:, pos]
                return act

            out[layer, pos] = _run(model, tokens, metric, name, patch, clean)
    return out


def _by_head(model, tokens, cache, metric, hook: str, title: str, *, by_pos: bool = False) -> Tensor:
    """(layers, heads), or (layers, pos, heads): ``blocks.L.attn.{hook}`` patched for one head (at one position)."""
    n, heads, length = model.cfg.n_layers, model.cfg.n_heads, tokens.shape[-1]
    pattern = hook == "hook_pattern"
    kv = hook in ("hook_k", "hook_v")
    count = model.cfg.n_key_value_heads if kv else heads
    out = torch.zeros(n, length, count) if by_pos else torch.zeros(n, count)
    for layer in tqdm(range(n), desc=title, leave=False):
        name = f"blocks.{layer}.attn.{hook}"
        clean = _clean(cache, name)
        for head in range(count):
            for pos in range(length) if by_pos else [None]:

                def patch(act: Tensor, c: Tensor, head=head, pos=pos) -> Tensor:
                    if pattern:  # (batch, head, query, key)
                        index = (slice(None), head) if pos is None else (slice(None), head, pos)
                    else:  # (batch, pos, head, d_head)
                        index = (slice(None), slice(None), head) if pos is None else (slice(None), pos, head)
                    act[index] = c[index]
                    return act

                value = _run(model, tokens, metric, name, patch, clean)
                if by_pos:
                    out[layer, pos, head] = value
                else:
                    out[layer, head] = value
    return out


def get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, pos)``: the residual stream entering each block, patched one position at a time."""
    return _by_pos(model, corrupted_tokens, clean_cache, patching_metric, "hook_resid_pre", "resid_pre")


def get_act_patch_attn_out(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, pos)``: each attention sub-layer's output, patched one position at a time."""
    return _by_pos(model, corrupted_tokens, clean_cache, patching_metric, "hook_attn_out", "attn_out")


def get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, pos)``: each MLP's output, patched one position at a time."""
    return _by_pos(model, corrupted_tokens, clean_cache, patching_metric, "hook_mlp_out", "mlp_out")


def get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric) -> Tensor:
    """``(3, layers, pos)``: ``resid_pre``, ``attn_out`` and ``mlp_out``, each patched one position at a time."""
    return torch.stack(
        [
            get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_out(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, metric),
        ]
    )


def get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, heads)``: each head's output ``z``, patched at every position."""
    return _by_head(model, corrupted_tokens, clean_cache, patching_metric, "hook_z", "head out")


def get_act_patch_attn_head_out_by_pos(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, pos, heads)``: each head's output ``z``, patched one position at a time."""
    return _by_head(model, corrupted_tokens, clean_cache, patching_metric, "hook_z", "head out", by_pos=True)


def get_act_patch_attn_head_q_all_pos(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, heads)``: each head's queries, patched at every position."""
    return _by_head(model, corrupted_tokens, clean_cache, patching_metric, "hook_q", "head q")


def get_act_patch_attn_head_k_all_pos(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, key/value heads)``: each key head's keys, patched at every position."""
    return _by_head(model, corrupted_tokens, clean_cache, patching_metric, "hook_k", "head k")


def get_act_patch_attn_head_v_all_pos(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, key/value heads)``: each value head's values, patched at every position."""
    return _by_head(model, corrupted_tokens, clean_cache, patching_metric, "hook_v", "head v")


def get_act_patch_attn_head_pattern_all_pos(model, corrupted_tokens, clean_cache, patching_metric) -> Tensor:
    """``(layers, heads)``: each head's attention pattern, patched whole."""
    return _by_head(model, corrupted_tokens, clean_cache, patching_metric, "hook_pattern", "head pattern")


def get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, metric) -> Tensor:
    """``(5, layers, heads)``: each head's output, queries, keys, values and pattern, each patched at every
    position (keys and values per key/value head: under grouped-query attention the last axis is shorter there,
    and those rows are refused rather than padded)."""
    if model.cfg.n_key_value_heads != model.cfg.n_heads:
        raise ValueError(
            f"this model shares {model.cfg.n_key_value_heads} key/value heads among {model.cfg.n_heads} query heads, "
            "so keys and values have fewer heads than the stack's last axis: call get_act_patch_attn_head_k_all_pos "
            "and get_act_patch_attn_head_v_all_pos on their own"
        )
    return torch.stack(
        [
            get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_head_q_all_pos(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_head_k_all_pos(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_head_v_all_pos(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_head_pattern_all_pos(model, corrupted_tokens, clean_cache, metric),
        ]
    )


__all__ = [
    "get_act_patch_attn_head_all_pos_every",
    "get_act_patch_attn_head_k_all_pos",
    "get_act_patch_attn_head_out_all_pos",
    "get_act_patch_attn_head_out_by_pos",
    "get_act_patch_attn_head_pattern_all_pos",
    "get_act_patch_attn_head_q_all_pos",
    "get_act_patch_attn_head_v_all_pos",
    "get_act_patch_attn_out",
    "get_act_patch_block_every",
    "get_act_patch_mlp_out",
    "get_act_patch_resid_pre",
]
