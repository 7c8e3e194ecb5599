"""An attached HF causal LM decoded through multihead's own decoding step, over HF's own weights.

A decoding step through an attached model runs HF's modules: its layers, its cache API and multihead's attention
function in HF's registry -- hundreds of Python calls a step around the products. Where multihead reads the
model's family (Llama, Mistral, Qwen2, Qwen3: :mod:`multihead.pretrained.families.causal`), :func:`view` builds
multihead's :class:`~multihead.models.seq2seq.CausalLM` of the same config over **the same parameter objects**
(nothing copied: a weight changed in place is read by both, and the view costs no memory but its rotary
frequencies), and :meth:`AttachedLM.prefill <multihead.hf.folder.AttachedLM.prefill>` and ``step`` decode through
it: the lean step of :mod:`multihead.models.fast_decode`, with the kernel this machine measured fastest (the
compiled one where it wins). The tokens are HF's ``generate``'s; the logits agree within the order of additions.

HF's layers still serve whatever must see them, and :func:`why_not` says which applies: a model of another family
(or one the lean step cannot run: sliding windows, say), gradients, a hook on any of its modules (an analysis or an
intervention must see HF's layers run), a KV policy or a streaming cache, or ``ENABLED = False``. A hook added
while a generation runs sends the next step to HF's layers, through the same cache (HF's cache API over
multihead's cache: :class:`~multihead.hf.cache.PolicyCache`). The view is rebuilt when the model's parameters
are replaced (pruning, a module swapped).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

ENABLED = True

# model -> (the parameters it was built over, the view or the reason there is none); the model is held weakly
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stamp(model: nn.Module) -> tuple:
    return tuple((id(p), p.shape, p.dtype, p.device) for p in model.parameters())


def _build(model: nn.Module):
    """multihead's CausalLM over ``model``'s parameter objects, or the reason it cannot be built."""
    from ..models import fast_decode
    from ..models.seq2seq import CausalLM
    from ..pretrained.errors import LMError
    from ..pretrained.families.causal import family_of

    hf = model.config.to_dict()
    try:
        family = family_of(hf)
        if family.name != "llama":  # its import transforms tensors (a copy, not the same parameters)
            return f"multihead reads {family.name} by converting its weights, so a view would hold copies"
        config = family.config(hf)
        with torch.device("meta"):  # shapes only: every parameter is HF's own
            native = CausalLM(config)
        ours = family.to_ours(dict(model.state_dict(keep_vars=True)), config)
    except (LMError, ValueError) as e:
        return f"multihead does not read this model's layers ({e})"
    own = dict(native.named_parameters())
    missing = sorted(set(own) - set(ours))
    if missing or any(not isinstance(p, nn.Parameter) for p in ours.values()):
        return f"its weights do not cover multihead's layers ({', '.join(missing[:3]) or 'a tensor is no parameter'})"
    for name, p in ours.items():
        if name not in own or tuple(own[name].shape) != tuple(p.shape):
            return f"{name}: HF's {tuple(p.shape)} is not multihead's {tuple(own.get(name, p).shape)}"
        owner, _, leaf = name.rpartition(".")
        setattr(native.get_submodule(owner), leaf, p)
    if config.tie_embeddings:
        native.lm_head.weight = native.embed.weight
    device = next(model.parameters()).device
    for module in native.modules():
        if any(b.is_meta for b in module.buffers(recurse=False)):
            if not hasattr(module, "reset_buffers"):
                return f"{type(module).__name__} of multihead's model has buffers it cannot compute again"
            module.reset_buffers(device)
    left = [n for n, t in [*native.named_parameters(), *native.named_buffers()] if t.is_meta]
    if left:
        return f"{left[0]} has no HF tensor behind it"
    native.eval()
    reason = fast_decode.why_not_architecture(native)
    if reason is not None:
        return f"multihead's decoding step cannot run it: {reason}"
    return native


def view(model: nn.Module):
    """multihead's :class:`~multihead.models.seq2seq.CausalLM` over ``model``'s own parameters (an HF causal LM,
    attached or not): built once, again when the parameters are replaced. Refused with the reason
    (:func:`why_not_view`) for a model it cannot be built for."""
    made = _made(model)
    if isinstance(made, str):
        raise ValueError(f"{type(model).__name__} has no multihead view: {made}")
    return made


def _made(model: nn.Module):
    stamp = _stamp(model)
    kept = _VIEWS.get(model)
    if kept is None or kept[0] != stamp:
        kept = _VIEWS[model] = (stamp, _build(model))
    return kept[1]


def why_not_view(model: nn.Module) -> str | None:
    """Why :func:`view` cannot be built for ``model`` (None: it can)."""
    made = _made(model)
    return made if isinstance(made, str) else None


def why_not(model: nn.Module) -> str | None:
    """Why a generation of the attached ``model`` starting now decodes through HF's layers rather than multihead's
    step over the same weights (None: through multihead's)."""
    if not ENABLED:
        return "multihead.hf.lean.ENABLED is False"
    if torch.is_grad_enabled() or model.training:
        return "gradients are on or the model is training"
    _WATCHED[model] = watched = _hook_tables(model)
    if _hooked(watched):
        return "hooks are attached to its modules (an analysis or an intervention must see HF's layers run)"
    return why_not_view(model)


def why_not_step(model: nn.Module) -> str | None:
    """Why the next step of a generation :func:`why_not` admitted goes to HF's layers (None: it does not): a hook
    added since, gradients turned on. Cheap enough for every step (the modules are not walked again)."""
    if not ENABLED:
        return "multihead.hf.lean.ENABLED is False"
    if torch.is_grad_enabled() or model.training:
        return "gradients are on or the model is training"
    watched = _WATCHED.get(model)
    if watched is None or _hooked(watched):
        return "hooks are attached to its modules (an analysis or an intervention must see HF's layers run)"
    return None


# model -> each of its modules' forward-hook tables with the number of attaching's own hooks it held when a
# generation began (those drive the hook points: any other is an analysis's or an intervention's)
_WATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hook_tables(model: nn.Module) -> list[tuple[dict, int]]:
    from .record import _ATTACHED

    att = _ATTACHED.get(model)
    own = set() if att is None else {h.id for h in att.handles}
    tables = []
    for m in model.modules():
        for table in (m._forward_hooks, m._forward_pre_hooks):
            tables.append((table, sum(k in own for k in table)))
    return tables


def _hooked(tables: list[tuple[dict, int]]) -> bool:
    """Whether a forward hook other than attaching's own is on any module of the tables, or on every module."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(len(table) != own for table, own in tables)


__all__ = ["ENABLED", "view", "why_not", "why_not_step", "why_not_view"]
