"""multihead's KV policies on attached HF causal LMs, through transformers' own cache API.

:class:`PolicyCache` is a ``transformers.Cache``: pass it as ``past_key_values`` to the model or to ``generate``
and every layer keeps what the policy keeps (the window, H2O, SnapKV, the head-aware split...), with the evicted
keys' memory released::

    hf.attach(model)
    cache = PolicyCache(model, "snapkv", budget=256)
    model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

Each layer of the cache holds multihead's own layer cache (:mod:`multihead.modules.kv`), the same object a
native multihead model decodes with, so the two readings of one model keep the same keys and write the same tokens.
HF's attention layer hands its (rotated) keys and values to :meth:`PolicyLayer.update`, which passes them on
untouched and marks the layer; multihead's attention function, which the layer calls next, gives the layer cache
the queries, keys and values (the cache protocol: ``update`` then ``done``), attends what it answers, and lets it
score and evict. So a policy that reads attention scores (H2O, SnapKV) sees the real queries, and one that gives
each head its own keys (head-aware) is attended head group by head group.
"""

from __future__ import annotations

import weakref

from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from .attach import CALL_CHECKS, AttachError, attached
from .record import INSTALL

try:
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError:
    raise AttachError(f"multihead's KV policies on HF models need transformers: {INSTALL}") from None


class PolicyLayer(DynamicLayer):
    """One attention layer of a :class:`PolicyCache`: multihead's layer cache ``kv`` behind HF's layer API."""

    is_sliding = False
    is_compileable = False

    def __init__(self, kv, index: int, owner):
        super().__init__()
        self.kv, self.index = kv, index
        self.owner = owner  # the attach record of the model this cache serves (multihead.hf.attach.Attached)

    def lazy_initialization(self, *args, **kwargs) -> None:
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Mark this layer for the attention function that follows, and pass the new keys and values on."""
        if self.owner.policy_layer is not None:
            self.owner.policy_layer = None
            raise AttachError(
                "a KV-policy cache layer was updated twice without attention in between: the model does not "
                "compute its attention through multihead's attention function (is it attached?)"
            )
        self.owner.policy_layer = self
        return key_states, value_states

    def get_seq_length(self, *args) -> int:
        return int(getattr(self.kv, "seen", self.kv.length))

    def get_mask_sizes(self, query, *args) -> tuple[int, int]:
        n = query if isinstance(query, int) else int(query.shape[-1])
        return self.get_seq_length() + n, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:
        return -1

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Keep rows ``beam_idx`` (beam search): each row's kept keys go with it."""
        self.kv.reorder(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        self.kv.reorder(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (HF's beam search expands the prompt's cache so)."""
        import torch

        rows = self.get_seq_length() and self._rows()
        self.kv.reorder(torch.arange(rows).repeat_interleave(repeats))

    def _rows(self) -> int:
        groups = getattr(self.kv, "groups", None)
        k = groups[0].buffers.k if groups else getattr(self.kv, "k", None)
        return 0 if k is None else int(k.shape[0])

    def crop(self, max_length: int) -> None:
        raise ValueError(
            "a KV-policy cache has evicted keys, each row its own: it cannot be cropped back to a length "
            "(assisted and contrastive decoding crop; use greedy, sampling or beam search with a policy)"
        )


def _window(module: nn.Module) -> int | None:
    """The layer's sliding window (Mistral, Gemma 2 and 3's local layers), None for a global layer."""
    w = getattr(module, "sliding_window", None)
    return int(w) if isinstance(w, int) and w > 0 else None


def cache_argument(model: nn.Module, cache) -> dict:
    """The keyword the model's forward takes a cache by: ``cache`` (transformers 5.x, where ``past_key_values`` is
    deprecated) or ``past_key_values``."""
    import inspect

    try:
        names = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        names = {}
    return {"cache": cache} if "cache" in names else {"past_key_values": cache}


def policy_layers(
    model: nn.Module, policy, budget: int | None = None, *, record=False, prompt_only: bool = False, **options
):
    """multihead's :class:`~multihead.modules.kv.KVCache` for the attached ``model``'s layers under
    ``policy`` (a name of :data:`~multihead.modules.kv.KV_POLICIES` or a
    :class:`~multihead.modules.kv.KVPolicy`): refused, with the reason, for a model whose attention layers
    are not one per decoder layer or that is not a decoder. ``prompt_only``: the policy evicts once, after the
    prompt, and the cache then keeps every new token (kvpress's protocol)."""
    from ..modules.kv import make_policy, policy_cache

    att = attached(model)
    att.needs_registry("a KV-policy cache")
    if getattr(model.config, "is_encoder_decoder", False):
        raise AttachError(
            f"{model.config.model_type} is an encoder-decoder; a KV policy keeps a causal LM's self-attention keys"
        )
    layers = list(att.layers.values())
    order = [getattr(rec._module, "layer_idx", i) for i, rec in enumerate(layers)]
    if order != list(range(len(layers))):
        raise AttachError(
            f"{model.config.model_type}: its attention layers are numbered {order[:8]}..., not one per decoder layer "
            "in order, so a per-layer cache cannot follow them"
        )
    made = make_policy(policy, budget, **options)
    if made.why_not("attached"):
        raise AttachError(made.why_not("attached"))
    windows = [_window(rec._module) for rec in layers]
    native = policy_cache(made, [rec.num_kv_heads for rec in layers], windows, record=record, prompt_only=prompt_only)
    rope = _rope(model)
    for kv in native.self_attn:
        kv.rope = rope  # HF rotates the keys before the cache sees them: the policies that model queries ask
    return native


def _rope(model: nn.Module):
    """The rotary frequencies ``(R,)`` every attention layer of ``model`` turns its queries and keys with (the one
    ``inv_freq`` buffer of its rotary embedding); None for a model without rotary positions; False where they
    cannot be told (several rotary embeddings with different frequencies, e.g. Gemma 3's local and global ones)."""
    found = {id(b): b for name, b in model.named_buffers() if name.rsplit(".", 1)[-1] == "inv_freq"}
    freqs = list(found.values())
    if not freqs:  # no frequencies to read: a model whose config speaks of rotary positions cannot be told
        c = model.config
        rotary = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct", "rotary_emb_base")
        return False if any(getattr(c, a, None) is not None for a in rotary) else None
    if any(f.shape != freqs[0].shape or not bool((f == freqs[0]).all()) for f in freqs[1:]):
        return False
    return freqs[0].detach().float()


# HF's view (PolicyCache.of) of each of multihead's caches, made once per cache, kept here (a KVCache compares by
# value, so it is keyed by identity)
_VIEWS = WeakIdKeyDictionary()


class PolicyCache(Cache):
    """A ``transformers.Cache`` whose layers keep what a multihead KV policy keeps (see the module docstring).
    ``model``: an attached HF causal LM; ``policy``, ``budget``, ``options``: as
    :func:`multihead.modules.kv.make_policy` takes them.

    One cache serves one generation of the model it was made for, on rows without padding: each call of the model
    is checked before any layer runs (:meth:`admit`), and a cache used with another model, a second prompt after
    the first generation, or a left-padded batch is refused with the fix. A cache filled with a context by one call
    of the model (kvpress's protocol: the context compressed, then the question and the answer) is continued by
    ``generate`` as HF's own cache is."""

    def __init__(
        self, model: nn.Module, policy="full", budget: int | None = None, *, native=None, one_generation=True, **options
    ):
        owner = attached(model)
        owner.needs_registry("a KV-policy cache")
        native = policy_layers(model, policy, budget, **options) if native is None else native
        super().__init__(layers=[PolicyLayer(kv, i, owner) for i, kv in enumerate(native.self_attn)])
        # multihead's KVCache: its layers, policy and byte counts. A view made by :meth:`of` holds it weakly: the
        # table of views is keyed by it, and a strong reference from the view would keep every cache ever viewed
        self._native = weakref.ref(native) if not one_generation else (lambda: native)
        self.owner = owner  # the attach record of the model this cache was made for
        self.one_generation = one_generation  # False for a view of a native cache (:meth:`of`): its own loop decides
        self.generated = False  # a token was decoded into it (a context alone may still be continued)

    def admit(self, att, length: int | None, attention_mask: Tensor | None = None) -> None:
        """Refuse a call of the attached model ``att`` on ``length`` new tokens that this cache cannot serve as
        the model would with its own cache: another model's, padded rows (each row's positions would be off by its
        padding), and, for a cache made with :class:`PolicyCache` ``(model, ...)``, a new prompt after its
        generation (the policy has already evicted for the first one)."""
        if att is not self.owner:
            made_for = f"{type(self.owner.model).__name__} with {len(self.layers)} attention layers"
            raise AttachError(
                f"this PolicyCache was made for another model ({made_for}); make one for the model you call: "
                "PolicyCache(model, policy, budget)"
            )
        if len(att.layers) != len(self.layers):
            raise AttachError(
                f"this PolicyCache has {len(self.layers)} layers and the model has {len(att.layers)} attention "
                "layers: it was made for another model; make one with PolicyCache(model, policy, budget)"
            )
        if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.bool().all()):
            raise AttachError(
                "a KV-policy cache reads unpadded rows (each row's positions are its own count, and a padded row's "
                "would be off by its padding); generate one row at a time, or rows of one length"
            )
        seen = self.get_seq_length()
        if length == 0 or (self.one_generation and self.generated and length not in (None, 1)):
            raise AttachError(
                f"this PolicyCache has served a generation already ({seen} tokens, the policy's evictions done); one "
                "cache serves one generation: make a new PolicyCache(model, policy, budget) for each generate call "
                "(a cache that holds only a context, filled by one call of the model, is continued by generate)"
            )
        if length == 1 and seen > 0:
            self.generated = True  # decoding has begun: what the cache holds is this generation's

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        if not 0 <= layer_idx < len(self.layers):
            raise AttachError(
                f"layer {layer_idx} reached a PolicyCache of {len(self.layers)} layers: it was made for another "
                "model; make one with PolicyCache(model, policy, budget)"
            )
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @classmethod
    def of(cls, native, model: nn.Module | None = None) -> PolicyCache:
        """HF's view of multihead's :class:`~multihead.modules.kv.KVCache` ``native`` (made by
        :func:`policy_layers`, or compressed from a recorded one) for the attached ``model``: the same layer
        objects, so what one keeps the other sees. Made once per ``native``; the loop that made ``native`` decides
        how many prompts it reads."""
        if model is None:
            raise ValueError("PolicyCache.of needs the model the cache serves: PolicyCache.of(native, model)")
        made = _VIEWS.get(native)
        if made is None or made.owner is not attached(model):
            made = _VIEWS[native] = cls(model, native=native, one_generation=False)
        return made

    @property
    def native(self):
        """multihead's :class:`~multihead.modules.kv.KVCache` this cache keeps (or views)."""
        native = self._native()
        if native is None:
            raise ValueError("the multihead cache this view was made of is gone: keep it while the model reads it")
        return native

    def get_seq_length(self, layer_idx: int = 0, *args) -> int:
        return self.layers[layer_idx].get_seq_length()

    def kv_nbytes(self) -> int:
        """Bytes of the keys and values the layers keep, as filled (what the policy saves)."""
        return self.native.kv_nbytes()


def _admit(att, args, kwargs) -> None:
    """The call check of :data:`multihead.hf.attach.CALL_CHECKS`: a :class:`PolicyCache` handed to the model
    checks the call (:meth:`PolicyCache.admit`)."""
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    if not isinstance(cache, PolicyCache):
        return
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    cache.admit(att, None if ids is None else int(ids.shape[1]), kwargs.get("attention_mask"))


CALL_CHECKS.append(_admit)

__all__ = ["PolicyCache", "PolicyLayer", "cache_argument", "policy_layers"]
