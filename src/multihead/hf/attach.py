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
seen this way: :func:`why_not` names them, and :func:`attach` refuses such a model rather than miss them silently.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
import math
import itertools
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from ..attention import attention
from ..attention.attn_mask import AttnMask
from ..attention.ops import expand_kv, zero_rows
from ..modules.anatomy import FINAL_NORM_NAMES, MLP_NAMES, Anatomy, blocks_of, child, norm_parts, register_source
from ..modules.anatomy import token_embedding
from ..modules.hooks import HookPoint
from ..pretrained.errors import SourceError

NAME = "multihead"  # the name in HF's AttentionInterface and AttentionMaskInterface
# The layer of a multihead KV-policy cache (multihead.hf.cache.PolicyLayer) whose update HF just called: the
# attention function that HF calls next gives it the queries too (the cache protocol), then clears it.
INSTALL = "pip install 'multihead[hf]'"
ATTENTION_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_stats")
BLOCK_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
_OUT_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "o", "wo", "out_lin", "attention_out")
# The norm whose input is the residual stream between attention and MLP, per model type: only sequential pre-norm
# blocks have one (parallel blocks such as GPT-NeoX's and Phi's, and post-norm blocks, have no such point).
_MID_NORM = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen3", "granite", "phi3", "starcoder2", "persimmon", "stablelm"),
        "post_attention_layernorm",
    ),
    **dict.fromkeys(("gemma2", "gemma3", "gemma3_text"), "pre_feedforward_layernorm"),
    **dict.fromkeys(("gpt2", "gpt_bigcode"), "ln_2"),
    **dict.fromkeys(("opt", "whisper"), "final_layer_norm"),
}


class AttachError(SourceError):
    """A model multihead cannot attach to (the message says why and what works instead)."""


class ProbeError(AttachError):
    """The probe pass that finds the attention layers failed on the inputs it was given."""


def _transformers():
    try:
        import transformers  # noqa: F401
        from transformers import masking_utils, modeling_utils
    except ImportError:
        raise AttachError(f"attaching to HF models needs transformers: {INSTALL}") from None
    return modeling_utils, masking_utils


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


def _set_implementation(model: nn.Module, name: str) -> list[tuple[object, str]]:
    """Switch ``model`` and its sub-models to the attention implementation ``name`` with transformers' own
    ``set_attn_implementation``; returns every config's previous implementation. transformers declines to switch a
    class whose module source it cannot read (a class defined in a notebook or a string); those configs are set
    through the config's own ``_attn_implementation`` property, and the probe pass then shows whether the layers
    really call the registry."""
    configs = _configs(model)
    before = [(c, c._attn_implementation) for c in configs]
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its "does not support setting ... dynamically" warning: handled below
    try:
        model.set_attn_implementation(name)
    except Exception:  # noqa: BLE001, S110  4.57 reads sys.modules[cls.__module__].__file__: KeyError, OSError...
        pass  # the configs are set below either way
    finally:
        hf_logging.set_verbosity(level)
    for c in configs:
        if c._attn_implementation != name:
            c._attn_implementation = name
    return before


def _restore_implementation(before: list[tuple[object, str]]) -> None:
    for c, old in before:  # parents first: a config's setter also sets its sub-configs, which then get their own
        c._attn_implementation = old


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


# ------------------------------------------------------------------------------------------ the record per layer
def _int(obj, names) -> int | None:
    for n in names:
        v = getattr(obj, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _output_projection(name: str, module: nn.Module, named: dict[str, nn.Module]) -> nn.Module | None:
    for n in _OUT_NAMES:
        c = getattr(module, n, None)
        if isinstance(c, nn.Linear) or type(c).__name__ == "Conv1D":
            return c
    parent = named.get(name.rsplit(".", 1)[0]) if "." in name else None  # ViT, DINOv2: attention.output.dense
    output = getattr(parent, "output", None)
    dense = getattr(output, "dense", output)  # BigBird-Pegasus: attention.output is the projection itself
    return dense if isinstance(dense, nn.Linear) else None


class AttachedAttention:
    """multihead's view of one attached HF attention layer: its hook points (children of the HF module, so that
    ``capture`` names them ``model.layers.0.self_attn.hook_pattern``), its head counts, the output projection
    ``w_o`` (``(E, H*D)``, as multihead's modules have it), ``stats_options`` for ``hook_stats`` and the kernel
    seam's ``backend``."""

    w_gate = None  # no gated heads

    def __init__(self, name: str, module: nn.Module, named: dict[str, nn.Module], backend: str):
        cfg = getattr(module, "config", None)
        h = _int(module, ("num_heads", "num_attention_heads", "n_heads", "n_head")) or _int(
            cfg, ("num_attention_heads", "n_head", "n_heads")
        )
        groups = _int(module, ("num_key_value_groups",))
        g = _int(module, ("num_key_value_heads", "num_kv_heads"))
        if g is None and groups and h:
            g = h // groups
        g = g or h  # no grouping attribute: one key/value head per query head (the tensors correct it on a call)
        d = _int(module, ("head_dim", "head_size", "attention_head_size")) or _int(cfg, ("head_dim",))
        if d is None and h:
            d = (_int(cfg, ("hidden_size", "n_embd", "d_model")) or 0) // h or None
        self.name, self.num_heads, self.num_kv_heads, self.head_dim = name, h, g, d
        self.backend = backend
        self.stats_options: dict = {}
        self.out_proj = _output_projection(name, module, named)
        self._module = module
        self.owner: Attached | None = None  # the Attached record of the model (set by attach)
        self.index = 0  # the layer's place among the model's attention layers (set by attach)
        self.scale: float | None = None  # the score scaling of the last call (HF models choose their own)
        # whether the output projection reads hook_z as it is (None: not known); set by attach
        self.z_feeds_output: bool | None = None
        self.probe_lengths: tuple[int, int] = (0, 0)  # (queries, keys) in the probe pass (set by attach)
        # what serves the layer: "registry" (HF's attention registry calls multihead's function) or "observed" (the
        # model's own attention, seen at the function level: multihead.modules.observe)
        self.source = "registry"
        for hook in ATTENTION_HOOKS:
            setattr(self, hook, getattr(module, hook))

    def _projection(self, names: tuple[str, ...]) -> nn.Linear | None:
        for n in names:
            c = getattr(self._module, n, None)
            if isinstance(c, nn.Linear):
                return c
        return None

    @property
    def w_q(self) -> nn.Linear | None:
        """The query projection ``(H*D, E)`` where the layer has a separate one (None where q, k and v share one
        fused matrix, whose layout differs per architecture)."""
        return self._projection(("q_proj", "query", "q", "q_lin"))

    @property
    def w_k(self) -> nn.Linear | None:
        """The key projection ``(Hkv*D, E)`` (None: fused, as for :attr:`w_q`)."""
        return self._projection(("k_proj", "key", "k", "k_lin"))

    @property
    def w_v(self) -> nn.Linear | None:
        """The value projection ``(Hkv*D, E)`` (None: fused, as for :attr:`w_q`)."""
        return self._projection(("v_proj", "value", "v", "v_lin"))

    @property
    def w_o(self):
        """The output projection with its weight as ``(E, H*D)``: the layer's own ``nn.Linear``, or a view of
        HF's GPT-2 ``Conv1D`` (stored transposed); None where multihead found none (the analyses that split it per
        head then refuse the layer by name)."""
        if self.out_proj is None:
            return None
        if isinstance(self.out_proj, nn.Linear):
            return self.out_proj
        return SimpleNamespace(weight=self.out_proj.weight.t(), bias=getattr(self.out_proj, "bias", None))

    def observe(self, q: Tensor, k: Tensor) -> None:
        """The head counts as the tensors show them (the truth where the module's attributes were ambiguous)."""
        self.num_heads, self.num_kv_heads, self.head_dim = q.shape[1], k.shape[1], q.shape[-1]


# ------------------------------------------------------------------------------------------ the attention function
def _mask(attention_mask, module: nn.Module, lq: int, lk: int, is_causal) -> AttnMask | None:
    """HF's mask as multihead's structured one. None from HF's SDPA mask builder means causal (or nothing, for an
    encoder): the fused path then builds nothing ``Lq x Lk``. A tensor mask is converted once per call of the model
    (every layer gets the same mask object; the conversion is kept on it and dies with it), not once per layer."""
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return AttnMask(causal=True) if causal and lq > 1 else None
    kept = getattr(attention_mask, "_multihead_mask", None)
    if kept is not None and kept[:2] == (attention_mask._version, lk):
        return kept[2]
    am = _convert(attention_mask, lk)
    attention_mask._multihead_mask = (attention_mask._version, lk, am)
    return am


def _convert(attention_mask: Tensor, lk: int) -> AttnMask:
    m = attention_mask
    if m.dim() == 4 and m.shape[-1] != lk:
        m = m[..., :lk]
    if m.dtype == torch.bool:
        return AttnMask(tensor=m)
    low = torch.finfo(m.dtype).min / 2
    blocked = m <= low
    if bool(((m == 0) | blocked).all()):
        return AttnMask(tensor=~blocked)  # an additive 0 / min mask is a bool mask
    return AttnMask(tensor=m.masked_fill(blocked, -math.inf))  # a real bias (T5's positions) stays a bias


def _with_bias(am: AttnMask | None, bias: Tensor | None, lk: int) -> AttnMask | None:
    """T5's relative-position bias (transformers 5 passes it beside the mask) added to the mask as a float part."""
    if bias is None:
        return am
    bias = bias[..., :lk]
    if am is None:
        return AttnMask(tensor=bias)
    if am.tensor is None:
        return replace(am, tensor=bias)
    if am.tensor.dtype == torch.bool:
        return replace(am, tensor=bias.masked_fill(~am.tensor, -math.inf))
    return replace(am, tensor=am.tensor + bias)


def _capped(q: Tensor, k: Tensor, am: AttnMask | None, scale: float, cap: float, sinks: Tensor | None) -> Tensor:
    """Soft-capped weights (Gemma 2): ``softmax(cap tanh(q k^T scale / cap) + mask)``, fp32, empty rows zero."""
    acc = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q.to(acc), expand_kv(k, q.shape[1]).to(acc).transpose(-2, -1)) * scale
    s = torch.tanh(s / cap) * cap
    dense = None if am is None else am.dense(q.shape[2], k.shape[2], q.device)
    row_ok = None
    if dense is not None:
        neg = -torch.finfo(acc).max
        s = s.masked_fill(~dense, neg) if dense.dtype == torch.bool else (s + dense.to(acc)).clamp_min(neg)
        row_ok = (s > neg).any(-1, keepdim=True)
    if sinks is not None:
        b, h, i, _ = s.shape
        p = torch.softmax(torch.cat([sinks.to(acc).view(1, h, 1, 1).expand(b, h, i, 1), s], -1), -1)[..., 1:]
    else:
        p = torch.softmax(s, -1)
    return zero_rows(p, row_ok).to(q.dtype)


def multihead_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """HF's attention-function signature on multihead's kernel seam and hook points; returns ``(B, Lq, H, D)`` and
    the weights when the caller asked for them (``output_attentions``)."""
    rec: AttachedAttention | None = _RECORDS.get(module)
    extra = _unknown(kwargs)
    if extra:  # a code path the probe pass did not take hands tensors this function would ignore
        raise AttachError(
            f"{type(module).__name__} hands the attention function {', '.join(extra)}, which multihead's attention "
            "does not compute with; detach the model (multihead.hf.detach) for this call"
        )
    q, k, v = query, key, value
    if rec is not None:
        rec.observe(q, k)
        q, k, v = rec.hook_q(q), rec.hook_k(k), rec.hook_v(v)
        kv = rec.owner.kv if rec.owner is not None else None
        if kv is not None:  # multihead's cache (HF's is off): one new token reads every cached key, no mask
            k, v = kv.update(rec.index, k, v)
            attention_mask = None if q.shape[2] == 1 else attention_mask
    lq, lk = q.shape[2], k.shape[2]
    am = _with_bias(_mask(attention_mask, module, lq, lk, is_causal), kwargs.get("position_bias"), lk)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scaling is None else float(scaling)
    layer = rec.owner.policy_layer if rec is not None and rec.owner is not None else None
    if layer is not None:  # a multihead KV-policy cache: it keeps the keys and says what to attend
        rec.owner.policy_layer = None
        return _policy_attention(module, rec, layer, q, k, v, am, scale, kwargs)
    if rec is not None:
        rec.scale = scale  # the layer's own scaling, as the last call had it (explain recomputes with it)
    cap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    sinks = None if sinks is None else sinks.to(q.dtype)
    p = float(dropout) if module.training else 0.0
    want = bool(kwargs.get("output_attentions", False)) or (
        rec is not None and rec.owner is not None and rec.owner.asking > 0
    )
    pattern = rec.hook_pattern if rec is not None and rec.hook_pattern.active else None
    if cap:
        w = _capped(q, k, am, scale, float(cap), sinks)
        if rec is not None and rec.hook_stats.active:
            from ..attention.stats import map_stats

            rec.hook_stats(map_stats(w.detach(), offset=lk - lq, **rec.stats_options))
        w = pattern(w) if pattern is not None else w
        dropped = nn.functional.dropout(w, p=p) if p > 0 else w
        z = torch.matmul(dropped, expand_kv(v, q.shape[1]))
        weights = w if want else None
    else:
        if rec is not None and rec.hook_stats.active:
            from ..attention.stats import attention_stats

            rec.hook_stats(attention_stats(q, k, mask=am, scale=scale, sinks=sinks, **rec.stats_options))
        z, weights = attention(
            q,
            k,
            v,
            mask=am,
            scale=scale,
            dropout_p=p,
            need_weights=want,
            backend=rec.backend if rec is not None else "auto",
            weights_hook=pattern,
            sinks=sinks,
        )
    if rec is not None:
        z = rec.hook_z(z)
    head_mask = kwargs.get("head_mask")
    if head_mask is not None:  # HF's eager head_mask scales each head's weights: the same as scaling its output
        z = z * head_mask
    return z.transpose(1, 2).contiguous(), weights


def _policy_attention(module, rec, layer, q: Tensor, k: Tensor, v: Tensor, am, scale: float, kwargs):
    """Attention through a multihead KV-policy cache layer (:mod:`multihead.hf.cache`): ``update`` stores what the
    policy keeps and answers the views to attend (one of every head, or one per group of heads with their own
    keys), the views are attended on the kernel seam, then ``done`` scores and evicts."""
    if rec is None or layer.index != rec.index:
        raise AttachError(
            f"{type(module).__name__}: the KV-policy cache's layer {layer.index} reached another layer's attention "
            f"({'not attached' if rec is None else rec.index}); the model's layers call the cache out of order"
        )
    if kwargs.get("softcap") or kwargs.get("position_bias") is not None or kwargs.get("head_mask") is not None:
        raise AttachError(
            f"{type(module).__name__} soft-caps its scores, adds a position bias or masks heads; a KV-policy cache "
            "attends through the kernel seam's plain softmax only"
        )
    sinks = kwargs.get("s_aux")
    q, views = layer.kv.update(q, k, v, mask=am)  # keys arrive rotated at their positions: no rotary here
    want = bool(kwargs.get("output_attentions", False)) or (rec.owner is not None and rec.owner.asking > 0)
    if len(views) == 1 and views[0].heads is None:
        view = views[0]
        pattern = rec.hook_pattern if rec.hook_pattern.active else None
        z, weights = attention(
            q,
            view.k,
            view.v,
            mask=view.mask,
            scale=scale,
            need_weights=want,
            backend=rec.backend,
            weights_hook=pattern,
            sinks=None if sinks is None else sinks.to(q.dtype),
        )
    else:  # heads that keep different keys: no single map to hook or return
        if want or rec.hook_pattern.active or rec.hook_stats.active:
            raise AttachError(
                f"this layer's heads keep different keys under the {layer.kv.policy.name} policy, so there is no single "
                "attention map: capture with policy='full' or a uniform policy"
            )
        from ..modules.kv_cache import attend_groups

        z = attend_groups(q, views, backend=rec.backend, scale=scale, sinks=sinks)
        weights = None
    layer.kv.done(q, views, None if sinks is None else sinks.detach().float())
    z = rec.hook_z(z)
    return z.transpose(1, 2).contiguous(), weights


# ------------------------------------------------------------------------------------------ attach and detach
@dataclass
class Attached:
    """What :func:`attach` changed on a model, to undo it: the attention layers (name -> record), the blocks'
    names, the configs' previous implementations and the hook handles."""

    model: nn.Module
    layers: dict[str, AttachedAttention]
    blocks: list[str]
    configs: list[tuple[object, object]] = field(default_factory=list)
    handles: list = field(default_factory=list)
    added: list[tuple[nn.Module, str]] = field(default_factory=list)
    # calls in flight that asked for the attention weights (output_attentions=True): transformers 4.57 does not
    # hand the flag to the attention function, so the model's own call says it (see _ask_weights)
    asking: int = 0
    asks: dict[int, list] = field(default_factory=dict)  # per top module: its calls in flight, (asked, quiet)
    # a cache multihead keeps while HF's is off (update(layer index, k, v) -> every cached k, v), e.g. the
    # StreamingLLM caches of multihead.hf.stream; None: HF's own cache, if any
    kv: object = None
    # the probe pass's input lengths (input_ids, decoder_input_ids): where each layer's shapes came from
    probe_lengths: dict = field(default_factory=dict)
    # the KV-policy cache layer HF updated last (``Cache.update``), for the attention function HF calls next: the
    # layer hands itself to this model's record, and the attention function takes it (multihead.hf.cache)
    policy_layer: object = None
    # attached by observation (multihead.modules.observe's record), and why the registry could not serve it; None
    # where every layer is served through the registry
    observed: object = None
    why_observed: str | None = None

    @property
    def source(self) -> str:
        """What serves the layers: ``"registry"`` or ``"observed"``."""
        return "registry" if self.observed is None else "observed"

    def needs_registry(self, what: str) -> None:
        """Refuse ``what`` (a KV-policy cache, a streaming cache) on a model attached by observation: those run
        inside multihead's attention function, which only the registry calls."""
        if self.observed is not None:
            raise AttachError(
                f"{what} needs multihead's attention function inside the model, which HF's attention registry calls; "
                f"this model is attached by observation ({self.why_observed or 'asked for'}), so its own attention "
                "runs and the cache cannot"
            )

    def detach(self) -> None:
        detach(self.model)


# What attach made, kept here (not in the models' own attributes): each attached model's record, and each attached
# layer's record for the attention function HF calls with the layer's module.
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, Attached] = weakref.WeakKeyDictionary()
_RECORDS: weakref.WeakKeyDictionary[nn.Module, AttachedAttention] = weakref.WeakKeyDictionary()


def is_attached(model: nn.Module) -> bool:
    return model in _ATTACHED


def attached(model: nn.Module) -> Attached:
    """The :class:`Attached` record of an attached model (a ValueError naming :func:`attach` otherwise)."""
    a = _ATTACHED.get(model)
    if a is None:
        raise AttachError(f"{type(model).__name__} is not attached; call multihead.hf.attach(model) first")
    return a


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


def _configs(model: nn.Module) -> list:
    """Every config object the model and its parts read their attention implementation from."""
    seen: dict[int, object] = {}

    def add(c) -> None:
        from transformers import PretrainedConfig

        if not isinstance(c, PretrainedConfig) or id(c) in seen:
            return
        seen[id(c)] = c
        for key in getattr(c, "sub_configs", {}) or {}:
            add(getattr(c, key, None))

    add(getattr(model, "config", None))
    for m in model.modules():
        add(getattr(m, "config", None))
    return list(seen.values())


def _block_of(name: str, named: dict[str, nn.Module]) -> str | None:
    """The entry of a layer list holding ``name`` (``model.layers.3``); the outermost one that is a module of its
    own, not a list (T5's ``block.3`` holds a list of sub-layers; PVT's ``block.0`` is a list of a stage's
    layers, whose ``block.0.1`` is the block)."""
    parts = name.split(".")
    containers = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
    for i in range(1, len(parts) + 1):
        parent = ".".join(parts[: i - 1]) if i > 1 else ""
        entry = ".".join(parts[:i])
        if (
            isinstance(named.get(parent), nn.ModuleList)
            and parts[i - 1].isdigit()
            and not isinstance(named.get(entry), containers)
        ):
            return entry
    return None


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _replace_first(x, new):
    return (new, *x[1:]) if isinstance(x, tuple) else new


def _hook_blocks(att: Attached, named: dict[str, nn.Module], model_type: str) -> None:
    """The block hook points around every attached layer (:func:`_hook_block`), each block once."""
    for name in att.layers:
        block = _block_of(name, named)
        if block is None or block in att.blocks:
            continue
        att.blocks.append(block)
        child = name[len(block) + 1 :].split(".")[0] if name != block else None
        _hook_block(att, block, named[block], child, model_type)


def _hook_block(att: Attached, name: str, block: nn.Module, attn_child: str | None, model_type: str) -> None:
    def add(obj: nn.Module, hook: str) -> HookPoint:
        if hook in obj._modules or hasattr(obj, hook):
            raise AttachError(f"{name} already has an attribute {hook!r}; multihead will not overwrite it")
        hp = HookPoint()
        obj.add_module(hook, hp)
        att.added.append((obj, hook))
        return hp

    pre, post = add(block, "hook_resid_pre"), add(block, "hook_resid_post")

    def before(mod, args, kwargs):
        if not pre.active:
            return None
        if args:
            return (pre(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": pre(kwargs["hidden_states"])}
        return None

    def after(mod, args, kwargs, out):
        return _replace_first(out, post(_first(out))) if post.active else None

    att.handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
    att.handles.append(block.register_forward_hook(after, with_kwargs=True))

    def output_hook(child: nn.Module, hook: str) -> None:
        hp = add(block, hook)
        att.handles.append(
            child.register_forward_hook(lambda m, a, out: _replace_first(out, hp(_first(out))) if hp.active else None)
        )

    if attn_child is not None:
        output_hook(block.get_submodule(attn_child), "hook_attn_out")
    mlp = child(block, MLP_NAMES)
    if mlp is not None:
        output_hook(mlp, "hook_mlp_out")
    norm = getattr(block, _MID_NORM.get(model_type, ""), None)
    if isinstance(norm, nn.Module) and not getattr(getattr(block, "config", None), "use_parallel_residual", False):
        mid = add(block, "hook_resid_mid")
        att.handles.append(
            norm.register_forward_pre_hook(lambda m, args: (mid(args[0]), *args[1:]) if mid.active else None)
        )


SOURCES = ("auto", "registry", "observed")


def _check_source(source: str) -> None:
    if source not in SOURCES:
        raise AttachError(f"unknown attach source {source!r}; one of {', '.join(SOURCES)}")


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
        probe = probe_inputs(model) if example is None else example
        att.probe_lengths = {
            k: int(v.shape[1]) for k, v in probe.items() if k in ("input_ids", "decoder_input_ids") and v.dim() == 2
        }
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
        _hook_blocks(att, named, model_type)
        _ask_weights(att)
        _check_policy_caches(att)
    except BaseException:
        _undo(att)
        raise
    _ATTACHED[model] = att
    _check_projection_inputs(att, example)
    return att


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
    att.probe_lengths = {
        k: int(v.shape[1]) for k, v in inputs.items() if k in ("input_ids", "decoder_input_ids") and v.dim() == 2
    }
    try:
        for site in observed.sites:
            rec = AttachedAttention(site.name, named[site.name], named, backend)
            rec.num_heads, rec.num_kv_heads, rec.head_dim = site.num_heads, site.num_kv_heads, site.head_dim
            rec.probe_lengths = site.probe_lengths
            rec.stats_options = site.stats_options  # the observer computes hook_stats with the record's options
            rec.owner, rec.index, rec.source = att, len(att.layers), "observed"
            att.layers[site.name] = rec
        _hook_blocks(att, named, model_type)
        _check_policy_caches(att)
    except BaseException:
        _undo(att)
        raise
    _ATTACHED[model] = att
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


def final_norm(model: nn.Module) -> nn.Module | None:
    """The norm an HF causal LM applies to the residual stream before its unembedding (None: none found)."""
    base = getattr(model, "base_model", model)
    for name in FINAL_NORM_NAMES:
        m = getattr(base, name, None)
        if isinstance(m, nn.Module) and getattr(m, "weight", None) is not None:
            return m
    return None


def _anatomy(model: nn.Module) -> Anatomy | None:
    """The anatomy source of attached HF models (:mod:`multihead.modules.anatomy`): the layers seen calling HF's
    attention registry, the blocks around them, the final norm and the output embedding. Recognises an attached
    model and multihead's wrappers of one (``.hf``)."""
    hf = getattr(model, "hf", model)
    att = _ATTACHED.get(hf) if isinstance(hf, nn.Module) else None
    if att is None:
        return None
    # names as the model handed in spells them (a wrapper holds the HF model as ``hf``)
    prefix = "" if hf is model else next(n for n, m in model.named_modules() if m is hf) + "."
    sites, blocks = blocks_of(model, [(prefix + n, rec) for n, rec in att.layers.items()], lambda block: None)
    enc, dec = att.probe_lengths.get("input_ids"), att.probe_lengths.get("decoder_input_ids")
    if enc is not None and dec is not None and enc != dec:  # an encoder-decoder: each layer placed by its shapes
        roles = {(enc, enc): "encoder", (dec, dec): "decoder", (dec, enc): "cross"}
        sites = [replace(s, role=roles.get(rec.probe_lengths)) for s, rec in zip(sites, att.layers.values())]
    get = getattr(hf, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return Anatomy(
        "hf",
        hf,
        tuple(sites),
        tuple(blocks),
        token_embedding(model),
        final_norm(hf),
        head if isinstance(head, nn.Module) else None,
    )


register_source("hf", _anatomy)


def _undo(att: Attached) -> None:
    for h in att.handles:
        h.remove()
    for obj, hook in att.added:
        obj._modules.pop(hook, None)
    for name in att.layers:
        _RECORDS.pop(att.model.get_submodule(name), None)
    if att.observed is not None and att.observed.model is att.model:
        from ..modules.observe import unobserve

        with contextlib.suppress(ValueError):
            unobserve(att.model)
    _restore_implementation(att.configs)
    att.configs = []
    att.handles.clear()
    att.added.clear()


def detach(model: nn.Module) -> nn.Module:
    """Undo :func:`attach`: the model's own attention implementation back, every hook point and hook removed.
    Returns the model."""
    att = attached(model)
    _undo(att)
    del _ATTACHED[model]
    return model


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
