"""Heads of an attached HF model removed from its weights, and the result saved as an HF folder transformers loads.

:func:`prune_heads` slices each attention layer's projections as multihead's own ``prune_heads`` does: the query
heads' rows of ``q``, their key/value heads' rows of ``k`` and ``v`` (a GQA group goes whole: its key/value head
is removed with the query heads that share it), and their columns of the output projection. The layer then
computes exactly what it computed with those heads' outputs zeroed (``head_mask``), with fewer multiply-adds.

HF configs hold one head count for every layer. :func:`save_pruned` writes the pruned model in its own
architecture: every layer is stored with the most heads any layer kept, a layer that kept fewer padded with
key/value groups whose output-projection columns are zero (a zero column adds exactly nothing), and ``head_dim``
written out. Before it is published the folder is read back with plain transformers and its logits compared with
the pruned model's: a folder that would not give the same model is never written.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
from torch import Tensor, nn

from .attach import AttachError, attached

# {layer: original query heads kept} of each model prune_heads has cut, kept here rather than on the model
_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[int, list[int]]] = weakref.WeakKeyDictionary()


def head_layout(model: nn.Module) -> tuple[int, int, int]:
    """``(layers, query heads, key/value heads)`` of an attached model's attention layers (the first layer's counts;
    every layer of the architectures multihead prunes has the same)."""
    recs = list(attached(model).layers.values())
    return len(recs), recs[0].num_heads, recs[0].num_kv_heads


def why_not_prune(model: nn.Module) -> str | None:
    """Why the heads of the attached ``model`` cannot be removed from its weights (None: they can)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "pruning is for decoder-only models; mask heads of an encoder-decoder instead"
    for name, rec in attached(model).layers.items():
        m = rec._module
        if None in (rec.w_q, rec.w_k, rec.w_v) or not isinstance(rec.out_proj, nn.Linear):
            return (
                f"{name} ({type(m).__name__}) does not keep separate query, key, value and output projections "
                "(nn.Linear): its fused layout is not sliced per head; mask heads instead (importance, head_mask)"
            )
        if rec.out_proj.in_features != rec.num_heads * rec.head_dim:
            return (
                f"{name}: its value heads are {rec.out_proj.in_features // max(rec.num_heads, 1)} wide and its query "
                f"heads {rec.head_dim}; pruning slices both at one width, so it is not offered; mask heads instead"
            )
        if rec.z_feeds_output is False:
            return f"{name} transforms the heads' outputs before its output projection (a norm, or differential attention); removing a head's slice would not remove the head"
        d = rec.head_dim
        for norm in ("q_norm", "k_norm"):
            w = getattr(getattr(m, norm, None), "weight", None)
            if isinstance(w, Tensor) and w.numel() != d:
                return (
                    f"{name}.{norm} normalises across all heads together ({w.numel()} values, not {d} per head): "
                    "removing a head would change the others; mask heads instead"
                )
    return None


def _slice(linear: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None) -> None:
    with torch.no_grad():
        w = linear.weight
        if rows is not None:
            linear.weight = nn.Parameter(w[rows].clone(), requires_grad=w.requires_grad)
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias[rows].clone(), requires_grad=linear.bias.requires_grad)
            linear.out_features = int(rows.numel())
        if cols is not None:
            linear.weight = nn.Parameter(linear.weight[:, cols].clone(), requires_grad=w.requires_grad)
            linear.in_features = int(cols.numel())


def _rows(heads: list[int], d: int) -> Tensor:
    return torch.tensor([h * d + i for h in heads for i in range(d)], dtype=torch.long)


def prune_heads(model: nn.Module, heads: dict[int, list[int]]) -> dict[int, list[int]]:
    """Remove ``heads`` (``{layer: [query heads]}``, indices as they are now) from the attached ``model``'s weights.
    A key/value head goes only with every query head that reads it: a list that splits a GQA group is refused,
    naming the group. Returns ``{layer: [query heads kept, as indices of the original model]}``, which is also
    kept on the model (:func:`kept_heads`)."""
    why = why_not_prune(model)
    if why is not None:
        raise AttachError(why)
    layers = list(attached(model).layers.values())
    kept = _KEPT.setdefault(model, {})
    for layer, chosen in sorted(heads.items()):
        if not 0 <= layer < len(layers):
            raise ValueError(f"layer {layer} does not exist; the model has layers 0..{len(layers) - 1}")
        rec = layers[layer]
        h, g, d = rec.num_heads, rec.num_kv_heads, rec.head_dim
        per = h // g
        chosen = sorted(set(chosen))
        bad = [x for x in chosen if not 0 <= x < h]
        if bad:
            raise ValueError(f"layer {layer} has heads 0..{h - 1}; {bad} are not among them")
        gone_groups = sorted({x // per for x in chosen})
        split = [k for k in gone_groups if not all(k * per + i in chosen for i in range(per))]
        if split:
            k = split[0]
            raise ValueError(
                f"layer {layer}: query heads {list(range(k * per, (k + 1) * per))} share key/value head {k}; remove "
                "them together (whole GQA groups) or mask single heads instead"
            )
        if len(gone_groups) == g:
            raise ValueError(f"layer {layer}: removing all {h} heads leaves no attention; keep at least one group")
        keep_q = [x for x in range(h) if x not in chosen]
        keep_kv = [k for k in range(g) if k not in gone_groups]
        m = rec._module
        _slice(rec.w_q, rows=_rows(keep_q, d))
        _slice(rec.w_k, rows=_rows(keep_kv, d))
        _slice(rec.w_v, rows=_rows(keep_kv, d))
        _slice(rec.out_proj, cols=_rows(keep_q, d))
        for attr, value in (("num_heads", len(keep_q)), ("num_key_value_heads", len(keep_kv))):
            if isinstance(getattr(m, attr, None), int):
                setattr(m, attr, value)
        rec.num_heads, rec.num_kv_heads = len(keep_q), len(keep_kv)
        original = kept.get(layer, list(range(h)))
        kept[layer] = [original[x] for x in keep_q]
    return {k: list(v) for k, v in kept.items()}


def kept_heads(model: nn.Module) -> dict[int, list[int]]:
    """``{layer: [original query heads kept]}`` for every layer :func:`prune_heads` touched (empty: none)."""
    return {k: list(v) for k, v in _KEPT.get(model, {}).items()}


def _padded_state(model: nn.Module, h_max: int, g_max: int) -> dict[str, Tensor]:
    """The model's state with every attention layer grown to ``h_max`` query and ``g_max`` key/value heads: the
    added groups' projections zero, their output-projection columns zero (they add exactly nothing)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = {id(mod): n for n, mod in model.named_modules()}
    for rec in attached(model).layers.values():
        d = rec.head_dim
        for lin, heads in ((rec.w_q, h_max), (rec.w_k, g_max), (rec.w_v, g_max)):
            prefix = names[id(lin)]
            w = state[prefix + ".weight"]
            state[prefix + ".weight"] = torch.cat([w, w.new_zeros(heads * d - w.shape[0], w.shape[1])])
            if lin.bias is not None:
                b = state[prefix + ".bias"]
                state[prefix + ".bias"] = torch.cat([b, b.new_zeros(heads * d - b.shape[0])])
        prefix = names[id(rec.out_proj)]
        w = state[prefix + ".weight"]
        state[prefix + ".weight"] = torch.cat([w, w.new_zeros(w.shape[0], h_max * d - w.shape[1])], 1)
    return state


def write_pruned(model: nn.Module, folder: Path, *, tokenizer_from: str | Path | None = None) -> dict:
    """Write the attached (pruned) ``model`` into ``folder`` (created; the caller publishes it) as an HF folder of
    its own architecture, and check it: read back with plain transformers, its logits must equal ``model``'s (a
    ValueError otherwise, naming the difference). Returns what :func:`save_pruned` returns."""
    import copy
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    recs = list(attached(model).layers.values())
    h_max, g_max = max(r.num_heads for r in recs), max(r.num_kv_heads for r in recs)
    config = copy.deepcopy(model.config)
    config.num_attention_heads, config.head_dim = h_max, recs[0].head_dim
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = g_max
    config.architectures = [type(model).__name__]
    state = _padded_state(model, h_max, g_max)
    # tied weights are stored once, as transformers stores them
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    tensors = {k: v.contiguous() for k, v in state.items() if k not in tied}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        src = Path(tokenizer_from) / name if tokenizer_from else None
        if src is not None and src.is_file():
            shutil.copyfile(src, folder / name)
    back = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    ids = (torch.arange(1, 9) % int(config.vocab_size)).unsqueeze(0)
    with torch.no_grad():
        want, got = model(input_ids=ids).logits, back(input_ids=ids).logits
    diff = float((want - got).abs().max())
    if not diff <= 1e-4 * max(1.0, float(want.abs().max())):
        raise ValueError(
            f"the pruned {config.model_type} model read back by transformers gives other logits (max |diff| "
            f"{diff:.2e}): this architecture does not read its head count from the config this way"
        )
    return {
        "heads_per_layer": h_max,
        "kv_heads_per_layer": g_max,
        "kept": {str(k): v for k, v in sorted(kept_heads(model).items())},
        "max_abs_logit_diff": diff,
        "parameters": sum(v.numel() for v in tensors.values()),
    }


def save_pruned(model: nn.Module, out: str | Path, *, tokenizer_from: str | Path | None = None, **publish) -> dict:
    """Publish the attached (pruned) ``model`` at ``out`` as an HF folder transformers loads (:func:`write_pruned`,
    checked before it is published; ``publish``: :class:`multihead._io.Publish`'s options). Returns
    ``heads_per_layer`` (as stored), ``kept`` (per layer), ``max_abs_logit_diff`` and ``parameters``."""
    from .._io import Publish

    with Publish(Path(out), "hf", **publish) as folder:
        return write_pruned(model, folder, tokenizer_from=tokenizer_from)


__all__ = ["head_layout", "kept_heads", "prune_heads", "save_pruned", "why_not_prune", "write_pruned"]
