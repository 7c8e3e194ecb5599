"""Key/value caches for incremental decoding.

Shape legend: ``B`` batch (beams included), ``G`` key/value heads, ``L`` cached positions, ``D`` head dim.

A decoder that generates token by token would recompute every earlier key and value at each step. A cache keeps
them: a self-attention layer appends the new tokens' keys/values (``L`` grows by one per step, and queries attend to
all ``L`` keys with the causal mask aligned to the bottom right, :func:`multihead.masks.causal_mask`); a
cross-attention layer computes the source's keys/values once and reuses them at every step. A grouped-query or
multi-query layer caches only its ``G`` key/value heads (:meth:`KVCache.nbytes` says how much that saves).

``KVCache`` also carries what the whole decoder needs between steps: the real-token mask of every cached position
(batched prompts of different lengths are left-padded) and the position reached by each row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .layer import KVView, LayerCache, RecordedLayer


class LayerKV:
    """One attention layer's cache: ``k``, ``v`` ``(B, G, L, D)`` (views of the filled part). ``static``: computed
    once (cross-attention). Self-attention keys/values are written into buffers that grow by doubling, so a step
    copies only its own new positions (``torch.cat`` per step would copy the whole cache every step: quadratic).

    It implements the layer-cache protocol (:class:`~multihead.modules.kv.layer.LayerCache`, as HF's
    ``Cache.update``): :meth:`update` takes the call's queries, keys and values, stores them and answers with the
    queries (rotated where the cache places positions) and the :class:`KVView` to attend; :meth:`done` has nothing to
    do; :meth:`source` gives a cross-attention cache's stored keys, so that the source is not projected again.
    :meth:`append` is this cache's own (multi-head latent attention stores its latents through it)."""

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self.length = 0

    def source(self) -> tuple[Tensor, Tensor] | None:
        """A cross-attention cache's stored keys and values (None: project the call's, and :meth:`update`)."""
        return (self._k, self._v) if self.static and self._k is not None and self._v is not None else None

    def update(self, q: Tensor, k: Tensor, v: Tensor, *, mask=None, rotary=None, positions=None):
        """This call's ``q`` ``(B, H, Q, D)``, ``k``, ``v`` ``(B, G, Q, D)`` (unrotated) in; ``(q, [KVView])`` out:
        self-attention rotates the new positions where they sit (``positions`` ``(B, Q)``, default the cached length
        onwards) and appends them; cross-attention stores the source's keys once."""
        if self.static:
            if rotary is not None:
                raise ValueError("rotary embeddings rotate self-attention; build cross-attention without rotary=")
            if self._k is None or self._v is None:
                self.store(k, v)
                return q, [KVView(k, v, mask)]
            return q, [KVView(self._k, self._v, mask)]
        if rotary is not None:
            q, k = rotary.rotate_pair(q, k, self.length, positions)
        k, v = self.append(k, v)  # (B, G, cached + Q, D)
        return q, [KVView(k, v, mask)]

    def done(self, q: Tensor, views: list[KVView], sinks: Tensor | None = None) -> None:
        """The call has attended ``views`` (``sinks``: the layer's sink logits, if any). Nothing to do here."""

    @property
    def k(self) -> Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions' keys/values; returns all of them (cached first)."""
        n, have = k.shape[2], self.length
        old_k, old_v = self._k, self._v
        if (
            old_k is not None
            and old_v is not None
            and (k.shape[:2] != old_k.shape[:2] or k.shape[3] != old_k.shape[3] or v.shape[3] != old_v.shape[3])
        ):
            raise ValueError(
                f"the cache holds keys (B, G, L, D)={tuple(old_k[:, :, :have].shape)} but this step brings "
                f"{tuple(k.shape)}; use one cache per batch (KVCache.reorder for beams)"
            )
        if old_k is None or old_v is None or have + n > old_k.shape[2]:
            cap = max(2 * self.capacity, have + n, 64)
            # zeros, not empty: a compiled step attends the whole buffer through a mask, and a masked NaN is NaN
            new_k = k.new_zeros(k.shape[0], k.shape[1], cap, k.shape[3])
            new_v = v.new_zeros(v.shape[0], v.shape[1], cap, v.shape[3])
            if have and old_k is not None and old_v is not None:
                new_k[:, :, :have] = old_k[:, :, :have]
                new_v[:, :, :have] = old_v[:, :, :have]
            self._k, self._v = new_k, new_v
        else:
            new_k, new_v = old_k, old_v
        new_k[:, :, have : have + n] = k
        new_v[:, :, have : have + n] = v
        self.length = have + n
        return new_k[:, :, : self.length], new_v[:, :, : self.length]

    def reserve(self, n: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """Room for ``n`` more positions (the buffers doubled where they are short; ``like``: a key ``(B, G, *, D)``
        giving the shape and dtype of a first buffer); returns the whole key and value buffers ``(B, G, C, D)``,
        to be written in place at :attr:`length` (a compiled step's static cache). Call :meth:`filled` after."""
        have = self.length
        if self._k is None or self._v is None or have + n > self._k.shape[2]:
            cap = max(2 * self.capacity, have + n, 64)
            b, g, _, d = like.shape if self._k is None else self._k.shape
            new_k = like.new_zeros(b, g, cap, d)
            new_v = like.new_zeros(b, g, cap, d if self._v is None else self._v.shape[3])
            if have and self._k is not None and self._v is not None:
                new_k[:, :, :have] = self._k[:, :, :have]
                new_v[:, :, :have] = self._v[:, :, :have]
            self._k, self._v = new_k, new_v
        return self._k, self._v

    def filled(self, n: int) -> None:
        """``n`` positions written in place into the buffers :meth:`reserve` gave."""
        self.length += n

    def store(self, k: Tensor, v: Tensor) -> None:
        self._k, self._v, self.length = k, v, k.shape[2]

    def reorder(self, index: Tensor) -> None:
        if self._k is not None and self._v is not None:
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._k, self._v) if t is not None)

    def kv_nbytes(self) -> int:
        """Bytes of the cached keys and values as filled (no spare capacity)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class StreamingKV(LayerKV):
    """StreamingLLM's cache for one rotary self-attention layer (Xiao et al. 2023, "Efficient Streaming Language
    Models with Attention Sinks"): the first ``sinks`` tokens ever seen plus a sliding window of the last ``window``
    tokens; older tokens are evicted, so memory stays bounded however long the text.

    Keys are stored **before** rotation and rotated at attention time by their *slot in the cache* (sinks first,
    then the window in order): positions are those within the cache, never beyond ``sinks + window``, which is what
    lets a model trained on short rows read a long stream (the paper's section 3.2). ``sinks=0`` is plain window
    attention; :attr:`seen` counts every token that went through. Once the cache is full, tokens must come one at a
    time (a chunk would need a different window per query)."""

    rolling = True

    def update(self, q: Tensor, k: Tensor, v: Tensor, *, mask=None, rotary=None, positions=None):
        """Append the unrotated keys, evict, then rotate keys by their slot and the queries as the last slots."""
        if rotary is None:
            raise ValueError(
                "a streaming (sinks + window) cache gives keys their slot in the cache as position; "
                "that needs rotary positions (build the model with positional='rope')"
            )
        k, v = self.append(k, v)  # (B, G, slots, D)
        q = rotary.rotate(q, k.shape[2] - q.shape[2])  # the queries are the last slots
        return q, [KVView(rotary.rotate(k, 0), v, mask)]

    def __init__(self, sinks: int, window: int) -> None:
        super().__init__()
        if sinks < 0 or window < 1:
            raise ValueError(f"a streaming cache needs sinks >= 0 and window >= 1, got sinks={sinks}, window={window}")
        self.sinks, self.window, self.seen = sinks, window, 0

    @property
    def k(self) -> Tensor | None:
        return self._k

    @property
    def v(self) -> Tensor | None:
        return self._v

    @property
    def capacity(self) -> int:
        return self.sinks + self.window

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add unrotated keys/values; evict what falls out of the window; returns the cached ones in slot order."""
        n = k.shape[2]
        if n > 1 and self.length + n > self.capacity:
            raise ValueError(
                f"this streaming cache holds {self.length} of {self.capacity} tokens; once it fills, feed "
                f"one token per step (got {n}): each query of a chunk would need its own window"
            )
        if self._k is not None and (k.shape[:2] != self._k.shape[:2] or k.shape[3] != self._k.shape[3]):
            raise ValueError(
                f"the cache holds keys (B, G, L, D)={tuple(self._k.shape)} but this step brings "
                f"{tuple(k.shape)}; use one cache per batch"
            )
        keys = k if self._k is None else torch.cat([self._k, k], 2)  # (B, G, L + n, D)
        values = v if self._v is None else torch.cat([self._v, v], 2)
        if keys.shape[2] > self.capacity:  # keep the sinks, drop the oldest window token(s)
            s = self.sinks
            keys = torch.cat([keys[:, :, :s], keys[:, :, keys.shape[2] - self.window :]], 2)
            values = torch.cat([values[:, :, :s], values[:, :, values.shape[2] - self.window :]], 2)
        self._k, self._v = keys, values
        self.length = keys.shape[2]
        self.seen += n
        return keys, values


@dataclass
class KVCache:
    """The caches of a whole decoder: ``self_attn[i]`` and ``cross_attn[i]`` per layer, the cached positions'
    real-token mask ``key_padding`` ``(B, L)`` and the next position of each row ``next_position`` ``(B,)``."""

    num_layers: int
    self_attn: list[LayerCache] = field(default_factory=list)
    cross_attn: list[LayerCache] = field(default_factory=list)
    key_padding: Tensor | None = None
    next_position: Tensor | None = None
    memory_keep: Tensor | None = None  # (B, S) the source's real tokens (encoder-decoder models)
    # a rotary model may run past its trained length with this cache (measuring what happens there); False: refused
    extrapolate: bool = False
    # the KVPolicy its self-attention layers follow (multihead.modules.kv); None: every key is kept
    policy: object | None = None

    @classmethod
    def streaming(cls, num_layers: int, *, sinks: int = 4, window: int = 1024) -> KVCache:
        """A cache of :class:`StreamingKV` layers (``sinks`` first tokens + a ``window`` of recent ones): bounded
        memory, positions within the cache (rotary models only)."""
        return cls(num_layers, self_attn=[StreamingKV(sinks, window) for _ in range(num_layers)])

    @property
    def rolling(self) -> bool:
        return bool(self.self_attn) and isinstance(self.self_attn[0], StreamingKV)

    def __post_init__(self) -> None:
        if not self.self_attn:
            self.self_attn = [LayerKV() for _ in range(self.num_layers)]
        if not self.cross_attn:
            self.cross_attn = [LayerKV(static=True) for _ in range(self.num_layers)]

    @property
    def length(self) -> int:
        """Cached positions (the same in every self-attention layer)."""
        return self.self_attn[0].length if self.self_attn else 0

    def nbytes(self) -> int:
        """Bytes held by the cache's key and value buffers (self-attention buffers grow by doubling)."""
        return sum(c.nbytes() for c in self.self_attn + self.cross_attn)

    def kv_nbytes(self) -> int:
        """Bytes of the cached keys and values alone, as filled (what a KV policy saves): no spare capacity, no
        bookkeeping. Under a policy, each layer's kept keys and values."""
        return sum(c.kv_nbytes() for c in self.self_attn + self.cross_attn)

    def compress(self, policy, *, prompt_only: bool = False) -> KVCache:
        """What ``policy`` (a :class:`~multihead.modules.kv.KVPolicy`) keeps of this recorded cache's prompt, as a
        new cache; this one is unchanged. Bit-identical to a prefill under ``policy`` (the scores are the same
        numbers), so one recorded prefill (``new_cache(record=True)``) serves every policy and budget.
        ``prompt_only``: the policy evicts once, and the new cache then keeps every token that follows (kvpress's
        protocol); by default it keeps evicting to the budget at every step. Each recorded layer does the work
        (:class:`~multihead.modules.kv.layer.RecordedLayer`), so that the cache module imports no policy module."""
        if not callable(getattr(policy, "rules", None)) or not callable(getattr(policy, "why_not", None)):
            raise ValueError(
                f"compress takes a KVPolicy (multihead.modules.kv.make_policy(name, budget)), not "
                f"{type(policy).__name__}"
            )
        policy.check_layers(len(self.self_attn))
        if policy.why_not("recorded"):
            raise ValueError(policy.why_not("recorded"))
        n, layers = len(self.self_attn), []
        for i, rec in enumerate(self.self_attn):
            if not isinstance(rec, RecordedLayer):
                raise ValueError(
                    "compress takes a recorded cache after its prompt: make it with new_cache(record=True) and run "
                    "the prompt through it first"
                )
            layers.append(rec.compressed(policy, i, n, prompt_only=prompt_only))
        out = KVCache(n, self_attn=layers, policy=policy)
        out.key_padding, out.next_position = self.key_padding, self.next_position
        return out

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (beam search: each surviving beam's parent), in place. Cross-attention caches are
        reordered too (they hold one copy per beam)."""
        for c in self.self_attn + self.cross_attn:
            c.reorder(index)
        if self.key_padding is not None:
            self.key_padding = self.key_padding.index_select(0, index)
        for name in ("next_position", "memory_keep"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).index_select(0, index))
