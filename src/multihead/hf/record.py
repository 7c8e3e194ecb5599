"""What attaching makes: the record of an attached model (:class:`Attached`) and of each attention layer
(:class:`AttachedAttention`), the errors, and the tables that keep them (not the models' own attributes).
Part of :mod:`multihead.hf.attach`, which re-exports every name."""

from __future__ import annotations

import contextlib

import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace

from torch import Tensor, nn

from ..pretrained.errors import SourceError

NAME = "multihead"  # the name in HF's AttentionInterface and AttentionMaskInterface
# The layer of a multihead KV-policy cache (multihead.hf.cache.PolicyLayer) whose update HF just called: the
# attention function that HF calls next gives it the queries too (the cache protocol), then clears it.
INSTALL = "pip install 'multihead[hf]'"
ATTENTION_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_stats")
BLOCK_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
_OUT_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "o", "wo", "out_lin", "attention_out")


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
