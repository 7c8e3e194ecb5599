"""Which layers of an HF model call transformers' attention registry, found by running it once through a recorder
registered there (:func:`observe`), why a model cannot be attached through it (:func:`why_not`), and the
observation that takes over where layers compute attention themselves. Part of :mod:`multihead.hf.attach`."""

from __future__ import annotations

import inspect
import itertools

import torch
from torch import Tensor, nn

from .record import (
    _restore_implementation,
    _set_implementation,
    AttachError,
    ProbeError,
    _int,
    _transformers,
    is_attached,
)


# ------------------------------------------------------------------------------------------ which layers route
PROBE = "multihead_probe"  # the recorders' names in HF's AttentionInterface: PROBE_1, PROBE_2, ... (one per pass)
_PROBES = itertools.count(1)


# Tensors an architecture may hand the attention function beside q, k, v and the mask: those multihead computes with
# (T5's position bias, gpt-oss's per-head sinks, head_mask) and those that do not change the result. Any other
# tensor (per-query sink logits, packed-sequence offsets, ...) would be ignored: such a layer is refused by name.
UNDERSTOOD = frozenset(("position_bias", "s_aux", "head_mask", "position_ids", "cache_position", "position_embeddings"))


def _unknown(kwargs: dict) -> list[str]:
    return sorted(k for k, v in kwargs.items() if isinstance(v, Tensor) and k not in UNDERSTOOD)


def _recorder(seen: dict):
    """An attention function for one probe pass (:func:`observe`): it notes in ``seen`` each module transformers
    hands it and returns zeros of the output's shape (``(B, Lq, H, Dv)``); nothing is computed, so it runs on the
    meta device too."""

    def record(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
        seen.setdefault(id(module), (module, tuple(query.shape), tuple(key.shape), set()))[3].update(_unknown(kwargs))
        b, h, lq, _ = query.shape
        return query.new_zeros(b, lq, h, value.shape[-1]), None

    return record


def probe_inputs(model: nn.Module) -> dict:
    """The smallest inputs one forward pass of ``model`` takes, built from its config and its forward's signature:
    4 token ids (and 2 decoder ids for an encoder-decoder), an image of the config's size, log-mel features of the
    config's length or 0.1 s of audio, on the model's device. Used by :func:`observe`."""
    cfg = model.config
    params = inspect.signature(model.forward).parameters
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    x: dict = {}
    if "input_ids" in params:
        try:
            n = model.get_input_embeddings().num_embeddings
        except (AttributeError, NotImplementedError):  # CLIP's two towers: the text config's vocabulary
            n = _int(cfg, ("vocab_size",)) or _int(getattr(cfg, "text_config", None), ("vocab_size",)) or 8
        x["input_ids"] = (torch.arange(1, 5, device=device) % n).unsqueeze(0)
    if "pixel_values" in params:
        vc = getattr(cfg, "vision_config", None) or cfg
        size = getattr(vc, "image_size", 224)
        hw = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        x["pixel_values"] = torch.zeros(1, getattr(vc, "num_channels", 3), *hw, device=device)
    if "input_features" in params and getattr(cfg, "num_mel_bins", None):
        frames = 2 * (_int(cfg, ("max_source_positions",)) or 1500)
        x["input_features"] = torch.zeros(1, cfg.num_mel_bins, frames, device=device)
    if "input_values" in params:
        x["input_values"] = torch.zeros(1, 1600, device=device)
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        n = _int(cfg, ("decoder_vocab_size", "vocab_size")) or 8
        x["decoder_input_ids"] = (torch.arange(1, 3, device=device) % n).unsqueeze(0)
    if "use_cache" in params:
        x["use_cache"] = False
    return x


def observe(model: nn.Module, example: dict | None = None) -> list[tuple[str, nn.Module, tuple, tuple]]:
    """The layers of ``model`` that call HF's attention registry, found by running it once: the model is switched
    to a recorder (:data:`PROBE`) that notes every module transformers hands it, on ``example`` (keyword inputs of
    ``model``'s forward; default :func:`probe_inputs`), then switched back. Returns ``(name, module, query shape,
    key shape)`` in the model's order. Nothing is computed in the attention layers, and every module's training
    flag is restored; forward hooks the user has on the model see the probe pass."""
    return _observe(model, example)[0]


def _observe(model: nn.Module, example: dict | None) -> tuple[list, dict[str, list[str]]]:
    """:func:`observe`'s layers, and for each layer that handed the attention function tensors it would not
    compute with (:data:`UNDERSTOOD`), their names."""
    modeling_utils, masking_utils = _transformers()
    name = f"{PROBE}_{next(_PROBES)}"  # this pass's own recorder: concurrent probes never share one
    seen: dict = {}
    modeling_utils.AttentionInterface.register(name, _recorder(seen))
    masking_utils.AttentionMaskInterface.register(name, masking_utils.AttentionMaskInterface._global_mapping["sdpa"])
    inputs = probe_inputs(model) if example is None else dict(example)
    modes = [(m, m.training) for m in model.modules()]
    before = _set_implementation(model, name)
    try:
        model.eval()
        with torch.no_grad():
            model(**inputs)
    except Exception as exc:  # noqa: BLE001  whatever the model raises on a probe input it does not take
        raise ProbeError(
            f"{type(model).__name__}: multihead finds the attention layers by running the model once, and the "
            f"probe input ({', '.join(inputs)}) failed ({type(exc).__name__}: {str(exc)[:200]}); pass example="
            "{...} (the keyword inputs of one small forward pass) to attach or why_not"
        ) from None
    finally:
        _restore_implementation(before)
        modeling_utils.AttentionInterface._global_mapping.pop(name, None)
        masking_utils.AttentionMaskInterface._global_mapping.pop(name, None)
        for m, mode in modes:
            m.training = mode
    order = [(n, m) for n, m in model.named_modules() if id(m) in seen]
    return [(n, m, *seen[id(m)][1:3]) for n, m in order], {
        n: sorted(seen[id(m)][3]) for n, m in order if seen[id(m)][3]
    }


def routes(cls: type) -> bool:
    """Deprecated: whether ``cls.forward``'s source text names HF's attention registry. :func:`attach` now finds
    the layers by observation (:func:`observe`), which also sees calls through a helper and classes with no source
    file; use ``attach(model).layers`` or :func:`observe`."""
    import warnings

    warnings.warn(
        "multihead.hf.attach.routes is deprecated: the layers are found by running the model once; use "
        "multihead.hf.attach.observe(model) or attach(model).layers",
        DeprecationWarning,
        stacklevel=2,
    )
    try:
        src = inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in src


def _survey(
    model: nn.Module, example: dict | None, observed: tuple | None = None
) -> tuple[str | None, list[tuple[str, nn.Module, tuple, tuple]]]:
    """``(why not through the registry, the layers seen calling it)`` from one probe pass (:func:`_observe`;
    ``observed``: its result, when already run). Where the reason is that layers compute attention without the
    registry (:data:`BYPASS`), the model can still be attached by observation."""
    modeling_utils, _ = _transformers()
    if not isinstance(model, modeling_utils.PreTrainedModel):
        return (
            f"{type(model).__name__} is not an HF transformers model (PreTrainedModel); multihead's own modules "
            "have the hook points already"
        ), []
    if is_attached(model):
        return f"{type(model).__name__} is already attached; call multihead.hf.detach(model) first", []
    try:
        seen, unknown = _observe(model, example) if observed is None else observed
    except ProbeError as exc:  # the model would not run under the probe's recorder: its own attention may
        return _Bypass(str(exc)), []
    except AttachError as exc:
        return str(exc), []
    if unknown:
        name, extra = next(iter(unknown.items()))
        kind = getattr(model.config, "model_type", type(model).__name__)
        return (
            f"{kind}: {name} hands the attention function {', '.join(extra)}, which multihead's attention does "
            "not compute with; attached, those layers would silently compute something else, so it is refused"
        ), []
    ids = {id(m) for _, m, _, _ in seen}
    prefixes = [n for n, _, _, _ in seen]

    def related(name: str) -> bool:
        return any(p == name or p.startswith(name + ".") or name.startswith(p + ".") for p in prefixes)

    bypassing = [
        (n, m)
        for n, m in model.named_modules()
        if "attention" in type(m).__name__.lower()
        and id(m) not in ids
        and not related(n)
        and any(isinstance(c, nn.Linear) or type(c).__name__ == "Conv1D" for c in m.modules())
    ]
    arch = getattr(model.config, "model_type", type(model).__name__)
    import transformers

    if bypassing:
        names = sorted({type(m).__name__ for _, m in bypassing})
        where = ", ".join(n for n, _ in bypassing[:3]) + (" ..." if len(bypassing) > 3 else "")
        return _Bypass(
            f"{arch}: its attention class {', '.join(names)} ({where}) computes attention itself instead of calling "
            f"transformers' attention registry (ALL_ATTENTION_FUNCTIONS) in transformers {transformers.__version__}: "
            "a forward pass never handed it to the registry, so multihead would not see those layers"
            + ("" if seen else "; newer transformers releases route more architectures through the registry"),
            [(n, type(m).__name__) for n, m in bypassing],
        ), seen
    if not seen:
        return _Bypass(f"{arch}: no layer of {type(model).__name__} called transformers' attention registry"), seen
    return None, seen


class _Bypass(str):
    """A reason not to attach through the registry that observation can take over: layers that compute attention
    without it (``modules``: ``(name, class name)`` of each module that looks like attention and was not seen)."""

    def __new__(cls, text: str, modules: list[tuple[str, str]] | None = None):
        made = super().__new__(cls, text)
        made.modules = modules or []
        return made


def why_not(model: nn.Module, example: dict | None = None, *, source: str = "auto") -> str | None:
    """Why :func:`attach` cannot take ``model`` through ``source`` (None: it can). ``example``: as for
    :func:`observe`. ``source``: as for :func:`attach` (``"registry"``: through HF's attention registry alone;
    ``"auto"``: the registry, or observation where layers compute attention without it, and then the answer is
    observation's refusal, if any)."""
    _check_source(source)
    why, _ = _survey(model, example)
    if why is None or source == "registry" or not isinstance(why, _Bypass):
        return None if why is None else str(why)
    from ..modules.observe import unobserve

    try:
        _observed(model, probe_inputs(model) if example is None else dict(example), why)
    except AttachError as exc:
        return str(exc)
    unobserve(model)
    return None


def why_not_skeleton(model: nn.Module) -> str | None:
    """:func:`why_not` for a model built on the meta device (sizes, no weights), so that a folder is refused before
    its weights are read. Some architectures compute on values in their forward pass (rotary tables, position
    ids), which the meta device cannot: then this answers None and :func:`attach` decides on the loaded model."""
    try:
        observed = _observe(model, None)
    except ProbeError:
        return None
    why = _survey(model, None, observed)[0]
    return None if why is None or isinstance(why, _Bypass) else str(why)  # observation decides on the weights


SOURCES = ("auto", "registry", "observed")


def _check_source(source: str) -> None:
    if source not in SOURCES:
        raise AttachError(f"unknown attach source {source!r}; one of {', '.join(SOURCES)}")


def _batch_of(inputs: dict) -> int | None:
    """The batch size of keyword inputs: the first dimension every tensor among them shares (None: they differ)."""
    firsts = {int(v.shape[0]) for v in inputs.values() if isinstance(v, Tensor) and v.dim() >= 2}
    return firsts.pop() if len(firsts) == 1 else None


def _observed(model: nn.Module, inputs: dict, why: str | None):
    """``model`` observed at the function level (:func:`multihead.modules.observe.observe`) on ``inputs``; refused
    (AttachError, naming the modules) where a module the registry survey found computing attention itself
    (``why.modules``) holds no observed call: it did not run on the probe input, or its attention is not one the
    observer can split into heads."""
    from ..modules.observe import ObserveError, observe as observe_calls, unobserve

    try:
        observed = observe_calls(model, example_batch=_batch_of(inputs), **inputs)
    except ObserveError as exc:
        raise AttachError(f"{why}; observed at the function level instead: {exc}" if why else str(exc)) from None
    except Exception as exc:  # noqa: BLE001  whatever the model raises on a probe input it does not take
        raise ProbeError(
            f"{why}; observed at the function level instead, the probe input failed too ({type(exc).__name__}: "
            f"{str(exc)[:200]}); pass example={{...}} (the keyword inputs of one small forward pass)"
        ) from None
    names = [site.name for site in observed.sites]
    missed = [
        (n, cls)
        for n, cls in getattr(why, "modules", [])
        if not any(s == n or s.startswith(n + ".") or n.startswith(s + ".") for s in names)
    ]
    # a module that ran and called no softmax at all computes no softmax attention (linear attention, a state-space
    # layer named after attention): nothing to miss
    missed = [
        (n, cls)
        for n, cls in missed
        if n not in observed.ran or any(m == n or m.startswith(n + ".") for m in observed.softmaxed)
    ]
    if missed:
        unobserve(model)
        idle = [(n, cls) for n, cls in missed if n not in observed.ran]
        if idle:
            where = ", ".join(f"{cls} ({n})" for n, cls in idle[:3]) + (" ..." if len(idle) > 3 else "")
            raise AttachError(
                f"{why}; observed at the function level instead, {where} did not run on the probe input, so its "
                "attention could not be seen; pass example={...} (keyword inputs of a forward pass that reaches it)"
            )
        where = ", ".join(f"{cls} ({n})" for n, cls in missed[:3]) + (" ..." if len(missed) > 3 else "")
        raise AttachError(
            f"{why}; observed at the function level instead, {where} made no attention call the observer can split "
            "into heads (fused attention, or softmax(q k^T) v over (batch, heads, queries, keys)), so multihead would "
            "miss it"
        )
    return observed
