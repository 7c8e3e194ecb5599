"""StreamingLLM's caches (Xiao et al. 2023) on an attached HF model: the full cache, a sliding window, and the
first ``sinks`` tokens plus the window, with positions within the cache.

The cache sits where multihead's attention function receives each layer's keys and values (it answers
``update(layer, k, v) -> (keys, values)``, as HF's ``Cache.update`` does), so it works on every attached rotary
architecture whichever cache classes its transformers release has. The model is called with HF's own cache off and
``position_ids`` set to the new token's slot. Keys arrive rotated at the slot they were written to; when the
window slides, each key is turned to its new slot by the model's own rotary embedding (the module's
``rotary_emb`` and its modelling file's ``apply_rotary_pos_emb``): rotations compose, so a key at slot ``j`` is the
key rotated at ``j``, as in multihead's own :class:`~multihead.modules.kv.StreamingKV`.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from .attach import AttachError, attached


def _rotary(model: nn.Module):
    """``(rotary_emb, apply_rotary_pos_emb)`` of an HF rotary model, or an AttachError naming what is missing."""
    found = [(n, m) for n, m in model.named_modules() if "rotary" in n.rsplit(".", 1)[-1]]
    emb = found[0][1] if len(found) == 1 else None
    others = [n for n, _ in found] if len(found) > 1 else []
    apply = getattr(sys.modules.get(type(model).__module__), "apply_rotary_pos_emb", None)
    kind = getattr(model.config, "model_type", type(model).__name__)
    if others:
        raise AttachError(
            f"{kind} has several rotary embeddings ({', '.join(others[:4])}, one per layer or kind of layer); "
            "the sliding caches turn keys with one of them, so they are not offered for it"
        )
    if emb is not None:
        import inspect

        params = list(inspect.signature(emb.forward).parameters.values())[2:]
        if any(p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD for p in params):
            raise AttachError(
                f"{kind}: its rotary embedding depends on the layer type ({', '.join(p.name for p in params)}); the "
                "sliding caches turn keys with one rotation for every layer, so they are not offered for it"
            )
    if emb is None or apply is None:
        raise AttachError(
            f"{kind}: the sliding caches give keys their slot in the cache as position, which needs rotary "
            "positions (a rotary_emb module and apply_rotary_pos_emb); this model has none, so only the full "
            "cache applies"
        )
    return emb, apply


class StreamCache:
    """Per-layer keys and values of an attached model fed one token at a time. ``window=None``: every token stays,
    at its position in the text (the positions run past the trained length). Otherwise the first ``sinks`` tokens
    and the last ``window`` ones, at slots ``0 .. sinks + window - 1``."""

    def __init__(self, model: nn.Module, *, window: int | None = None, sinks: int = 0):
        if window is not None and (window < 1 or sinks < 0):
            raise ValueError(f"a streaming cache needs sinks >= 0 and window >= 1, got sinks={sinks}, window={window}")
        attached(model).needs_registry("a streaming cache")
        self.model, self.window, self.sinks = model, window, sinks
        self.rotary = None if window is None else _rotary(model)
        self.layers = list(attached(model).layers.values())
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        self.slot: dict[int, Tensor] = {}  # the slot each stored key was rotated at
        self.seen = 0  # tokens fed so far
        self._rotation: tuple | None = None  # (step and deltas, cos, sin) of the current step

    @property
    def capacity(self) -> int | None:
        return None if self.window is None else self.sinks + self.window

    @property
    def length(self) -> int:
        return min(self.seen, self.capacity) if self.capacity is not None else self.seen

    def positions(self, n: int) -> Tensor:
        """The ``position_ids`` ``(1, n)`` of the next ``n`` tokens: their slots (sliding) or positions (full)."""
        if n > 1 and self.seen > 0:
            raise ValueError(
                f"this cache holds {self.length} tokens; after the first call, feed one token per step (got {n})"
            )
        if self.capacity is not None and n > self.capacity:
            raise ValueError(
                f"the first call brings {n} tokens, more than the cache's {self.capacity} slots; feed them one by one"
            )
        start = self.seen if self.capacity is None else min(self.seen, self.capacity - 1)
        return torch.arange(start, start + n).unsqueeze(0)

    def _turn(self, k: Tensor, delta: Tensor) -> Tensor:
        """``k`` ``(B, G, L, D)`` turned by ``delta`` ``(L,)`` positions with the model's rotary embedding. Every
        layer of a step has the same slots, so the rotation is computed once per step."""
        emb, apply = self.rotary
        key = (self.seen, delta.numel())  # every layer evicts alike: one step, one set of slots
        if self._rotation is None or self._rotation[0] != key:
            cos, sin = emb(k, delta.unsqueeze(0).to(k.device))
            self._rotation = (key, cos.to(k.dtype), sin.to(k.dtype))
        _, cos, sin = self._rotation
        return apply(k, k, cos, sin)[1]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values of ``layer`` (rotated at :meth:`positions`); returns every cached one in
        slot order, the sliding caches' keys turned to their current slots."""
        n = k.shape[2]
        new_slots = self.positions(n).view(-1)
        if layer in self.k:
            keys, values = torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)
            slots = torch.cat([self.slot[layer], new_slots])
        else:
            keys, values, slots = k, v, new_slots
        cap = self.capacity
        if cap is not None and keys.shape[2] > cap:  # keep the sinks, drop the oldest window token(s)
            s, w = self.sinks, self.window
            keys = torch.cat([keys[:, :, :s], keys[:, :, -w:]], 2)
            values = torch.cat([values[:, :, :s], values[:, :, -w:]], 2)
            slots = torch.cat([slots[:s], slots[-w:]])
        self.k[layer], self.v[layer], self.slot[layer] = keys, values, slots
        if layer == len(self.layers) - 1:
            self.seen += n
        if cap is None:
            return keys, values
        delta = torch.arange(keys.shape[2]) - slots
        if bool((delta == 0).all()):
            return keys, values
        return self._turn(keys, delta), values


__all__ = ["StreamCache"]
