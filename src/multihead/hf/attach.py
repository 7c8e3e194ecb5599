"""Attach multihead to an HF transformers model through HF's own attention registry.

HF models since transformers 4.48 call attention through one table, ``ALL_ATTENTION_FUNCTIONS[config.
_attn_implementation]`` (``AttentionInterface``): every attention layer hands the function its rotated queries
``(B, H, Lq, D)``, its keys and values ``(B, Hkv, Lk, D)`` (not repeated for GQA), the mask the model built, the
scale, and per-architecture extras (``sliding_window``, ``softcap``, ``s_aux`` sinks). :func:`attach` registers
multihead's function under the name ``"multihead"`` (and HF's SDPA mask builder beside it, so a causal model with no
padding passes no ``L x L`` mask at all), switches the model to it (``set_attn_implementation``), and gives every
layer that calls the registry multihead's hook points as children. Those layers are found by observation: one
forward pass on a few tokens (or an image, or audio) through a recorder registered in the same table notes every
module transformers hands the attention function (:func:`observe`), so a layer that calls it through a helper, or
a class with no source file, is seen like any other:

* on each attention layer: ``hook_q``, ``hook_k``, ``hook_v`` (after rotary; keys and values with the model's
  ``Hkv`` heads), ``hook_pattern`` (weights, computed only while hooked), ``hook_z`` (per-head outputs before the
  output projection) and ``hook_stats`` (exact statistics from tiles, without the ``Lq x Lk`` map);
* on each block (an entry of the model's layer list): ``hook_resid_pre``, ``hook_resid_post``, ``hook_attn_out``
  (what its attention part returns), and where the architecture has them ``hook_mlp_out`` and ``hook_resid_mid``
  (the residual stream between attention and MLP of a sequential pre-norm block).

The attention itself runs on multihead's kernel seam (every exact backend, GQA without expanding K/V, sinks); the
soft-capped scores of Gemma 2 run as the reference formula with the cap. :func:`detach` restores the model's own
implementation and removes every hook point. Layers whose attention does not go through the registry cannot be
seen this way: :func:`attach` then observes the model's own attention at the function level instead
(:mod:`multihead.modules.observe`; ``source="auto"``), and refuses, naming the module, only a model that neither
way can serve without missing a layer (:func:`why_not` says why).

This module is the front: attaching and detaching. Its parts: :mod:`.probe` (which layers call the registry, why a
model cannot be attached, observation where it takes over), :mod:`.function` (multihead's attention function in the
registry), :mod:`.blocks` (the residual-stream hook points and the anatomy source ``"hf"``) and :mod:`.record` (the
records attaching makes, and undoing them). Every public name is importable from here.
"""

from __future__ import annotations


import torch
from torch import Tensor, nn

from ..modules.anatomy import norm_parts
from ..modules.hooks import HookPoint
from .blocks import _hook_blocks, final_norm
from .function import multihead_attention_forward
from .probe import (
    SOURCES,
    _Bypass,
    _check_source,
    _observed,
    _survey,
    observe,
    probe_inputs,
    routes,
    why_not,
    why_not_skeleton,
)
from .record import (
    _set_implementation,
    _undo,
    detach,
    ATTENTION_HOOKS,
    AttachError,
    Attached,
    AttachedAttention,
    BLOCK_HOOKS,
    NAME,
    ProbeError,
    _ATTACHED,
    _RECORDS,
    _transformers,
    attached,
    is_attached,
)


NAME_EAGER_MASKS = NAME + "_eager_masks"  # the same function, with the explicit masks eager attention builds


def _register() -> None:
    modeling_utils, masking_utils = _transformers()
    masks = masking_utils.AttentionMaskInterface._global_mapping
    for name, builder in ((NAME, "sdpa"), (NAME_EAGER_MASKS, "eager")):
        modeling_utils.AttentionInterface.register(name, multihead_attention_forward)
        masking_utils.AttentionMaskInterface.register(name, masks[builder])


def _name_for(model: nn.Module) -> str:
    """:data:`NAME` for a model that runs under SDPA (its mask builder may leave a causal mask implicit, and the
    layers say ``is_causal``); for an eager-only model, whose layers need not say it (NLLB-MoE's decoder does not),
    the name whose mask builder writes every mask out."""
    return NAME if getattr(model, "_supports_sdpa", False) else NAME_EAGER_MASKS


def attach(model: nn.Module, *, backend: str = "auto", example: dict | None = None, source: str = "auto") -> Attached:
    """Give ``model`` (an HF ``PreTrainedModel``) multihead's attention function and hook points (see the module
    docstring); returns the :class:`Attached` record (also kept on the model). ``backend``: the kernel seam's
    backend for every layer (``auto`` picks the fastest exact one). The attention layers are those seen calling
    HF's registry in one forward pass on ``example`` (keyword inputs; default: a few tokens, or an image or audio
    of the config's size: :func:`observe`).

    ``source``: ``"registry"`` serves every layer through HF's registry and refuses a model whose layers compute
    attention without it; ``"observed"`` leaves the model's own attention in place and finds every call by
    observation at the function level (:mod:`multihead.modules.observe`: fused SDPA or attention written by hand);
    ``"auto"`` (default) takes the registry where every layer calls it, else observation. Each record says which
    served it (:attr:`AttachedAttention.source`). Refuses, with the reason, a model that is not an HF model, is
    already attached, or that neither source can serve (:func:`why_not`)."""
    from ..attention.registry import check_backend_name

    check_backend_name(backend)
    _check_source(source)
    why, seen = _survey(model, example)
    if isinstance(why, _Bypass) and source != "registry" or why is None and source == "observed":
        return _attach_observed(model, backend, example, why)
    if why is not None:
        raise AttachError(str(why))
    _register()
    named = dict(model.named_modules())
    model_type = str(getattr(model.config, "model_type", ""))
    att = Attached(model, {}, [])
    try:
        att.configs = _set_implementation(model, _name_for(model))
        att.probe_lengths = _probe_lengths(probe_inputs(model) if example is None else example)
        for name, module, q_shape, k_shape in seen:
            for hook in ATTENTION_HOOKS:
                if hook in module._modules or hasattr(module, hook):
                    raise AttachError(f"{name} already has an attribute {hook!r}; multihead will not overwrite it")
                module.add_module(hook, HookPoint())
                att.added.append((module, hook))
            rec = AttachedAttention(name, module, named, backend)
            rec.num_heads, rec.num_kv_heads, rec.head_dim = q_shape[1], k_shape[1], q_shape[-1]
            rec.probe_lengths = (q_shape[2], k_shape[2])  # queries and keys in the probe pass
            rec.owner, rec.index = att, len(att.layers)
            _RECORDS[module] = rec
            att.layers[name] = rec
        _ask_weights(att)
    except BaseException:
        _undo(att)
        raise
    return _publish(att, named, model_type, example)


def _attach_observed(model: nn.Module, backend: str, example: dict | None, why: str | None) -> Attached:
    """:func:`attach` by observation: the model's own attention stays; :func:`multihead.modules.observe.observe`
    finds every call (fused or written by hand) and gives its owner the hook points; HF's structure gives the
    blocks, the output projections, the final norm and the unembedding, as for the registry."""
    inputs = probe_inputs(model) if example is None else dict(example)
    observed = _observed(model, inputs, why)
    observed.described_by = "hf"
    named = dict(model.named_modules())
    model_type = str(getattr(model.config, "model_type", ""))
    att = Attached(model, {}, [], observed=observed, why_observed=None if why is None else str(why))
    att.probe_lengths = _probe_lengths(inputs)
    try:
        for site in observed.sites:
            rec = AttachedAttention(site.name, named[site.name], named, backend)
            rec.num_heads, rec.num_kv_heads, rec.head_dim = site.num_heads, site.num_kv_heads, site.head_dim
            rec.probe_lengths = site.probe_lengths
            rec.stats_options = site.stats_options  # the observer computes hook_stats with the record's options
            rec.owner, rec.index, rec.source = att, len(att.layers), "observed"
            att.layers[site.name] = rec
    except BaseException:
        _undo(att)
        raise
    return _publish(att, named, model_type, example)


def _probe_lengths(inputs: dict) -> dict[str, int]:
    """The probe pass's input lengths (input_ids, decoder_input_ids): where each layer's shapes came from."""
    return {k: int(v.shape[1]) for k, v in inputs.items() if k in ("input_ids", "decoder_input_ids") and v.dim() == 2}


def _publish(att: Attached, named: dict[str, nn.Module], model_type: str, example: dict | None) -> Attached:
    """Either source's last steps: the blocks' hook points, the call checks, the record kept, the projections
    measured."""
    try:
        _hook_blocks(att, named, model_type)
        _check_policy_caches(att)
    except BaseException:
        _undo(att)
        raise
    _ATTACHED[att.model] = att
    _check_projection_inputs(att, example)
    return att


def _check_projection_inputs(att: Attached, example: dict | None) -> None:
    """Whether each layer's output projection reads the heads' outputs (``hook_z``) as they are, from one forward
    pass on random inputs: a norm between them (BitNet's ``attn_sub_norm``) or a combination of heads
    (differential attention) means that an edit of ``hook_z`` is not an edit of the projection's input, and the
    analyses that split the projection per head (direct logit attribution, pruning, explain) refuse the layer."""
    z: dict[str, Tensor] = {}
    fed: dict[str, Tensor] = {}
    handles = []
    for name, rec in att.layers.items():
        rec.z_feeds_output = None
        if not (isinstance(rec.out_proj, nn.Linear) or type(rec.out_proj).__name__ == "Conv1D"):
            continue
        handles.append(rec.hook_z.add_hook(lambda t, h, name=name: z.__setitem__(name, t.detach().clone())))
        handles.append(
            rec.out_proj.register_forward_pre_hook(
                lambda m, args, name=name: fed.setdefault(name, args[0].detach().clone())
            )
        )
    inputs = probe_inputs(att.model) if example is None else dict(example)
    g = torch.Generator().manual_seed(0)
    for key, value in list(inputs.items()):  # the probe's zeros and counting ids would hide a norm
        if isinstance(value, Tensor) and value.is_floating_point():
            inputs[key] = torch.randn(value.shape, generator=g).to(value.device, value.dtype)
    modes = [(m, m.training) for m in att.model.modules()]
    try:
        att.model.eval()
        with torch.no_grad():
            att.model(**inputs)
    except Exception:  # noqa: BLE001, S110  unknown stays None: the analyses then check nothing more
        pass
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes:
            m.training = mode
    for name, rec in att.layers.items():
        if name in z and name in fed:
            if z[name].numel() != fed[name].numel():  # the projection reads more than the heads (ConvBERT's convs)
                rec.z_feeds_output = False
                continue
            a = z[name].transpose(1, 2).reshape(fed[name].shape)
            rec.z_feeds_output = bool(torch.allclose(a, fed[name], atol=1e-6, rtol=1e-5))


# Checks run before each call of an attached model, before any layer: ``check(att, args, kwargs)`` raises to refuse
# the call. Other parts of multihead.hf add theirs here (the KV-policy cache checks the cache it is handed).
CALL_CHECKS: list = []


def _check_policy_caches(att: Attached) -> None:
    """Run :data:`CALL_CHECKS` before each call of the model (e.g. a KV-policy cache made for another model, padded
    rows, a second generation: refused before any layer runs, with the fix)."""

    def before(mod, args, kwargs):
        for check in CALL_CHECKS:
            check(att, args, kwargs)

    att.handles.append(att.model.register_forward_pre_hook(before, with_kwargs=True))


def _ask_weights(att: Attached) -> None:
    """Count the model's calls that ask for attention weights (``output_attentions=True``, or the config's), so
    that the attention function returns them even where transformers does not pass the flag down (4.57): then
    ``model(..., output_attentions=True).attentions`` and ``generate(..., output_attentions=True)`` hold the maps,
    as under eager."""
    tops = {id(m): m for m in (att.model, getattr(att.model, "base_model", None)) if isinstance(m, nn.Module)}
    for top in tops.values():

        def before(mod, args, kwargs):
            import warnings

            flag = kwargs.get("output_attentions")
            ask = bool(flag) if flag is not None else bool(getattr(mod.config, "output_attentions", False))
            quiet = None
            if ask:  # transformers warns that only eager returns the maps; attached, multihead's function does
                quiet = warnings.catch_warnings()
                quiet.__enter__()
                warnings.filterwarnings("ignore", message=r"`output_attentions=True` is not supported")
            att.asks.setdefault(id(mod), []).append((ask, quiet))
            att.asking += ask

        def after(mod, args, kwargs, output):
            asks = att.asks.get(id(mod))
            if asks:
                ask, quiet = asks.pop()
                att.asking -= ask
                if quiet is not None:
                    quiet.__exit__(None, None, None)

        att.handles.append(top.register_forward_pre_hook(before, with_kwargs=True))
        att.handles.append(top.register_forward_hook(after, with_kwargs=True, always_call=True))


__all__ = [
    "ATTENTION_HOOKS",
    "AttachError",
    "Attached",
    "AttachedAttention",
    "BLOCK_HOOKS",
    "ProbeError",
    "NAME",
    "SOURCES",
    "attach",
    "attached",
    "detach",
    "final_norm",
    "is_attached",
    "norm_parts",
    "multihead_attention_forward",
    "observe",
    "probe_inputs",
    "routes",
    "why_not",
    "why_not_skeleton",
]
