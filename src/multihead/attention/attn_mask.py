"""The structured attention mask: what each query may attend, kept as parts until a backend needs them dense.

Shape legend: ``b`` batch, ``h`` query heads, ``i`` query positions (``Lq``), ``j`` key positions (``Lk``).

::

    AttnMask(key_padding=keep,        # (b, j) bool, True = real key
             causal=True,             # j <= i + offset ...
             causal_offset=None,      # ... offset = Lk - Lq (bottom right) unless given: a KV cache is an offset
             pattern=SparsePattern(window=64),   # a sparsity pattern (geometry only)
             alibi=(0.5, 0.25, ...),  # ALiBi: -slope_h * |pos(i) - j| added per head (one slope per query head)
             tensor=None)             # any other mask: bool (True = may attend) or float bias, broadcastable
                                      # to (b, h, i, j)

A key is allowed when every part allows it; the ALiBi part adds a distance bias (query ``i`` sits at key position
``pos(i) = i + offset``, the causal rule's alignment). The mask is built once where it is born (a model's ``forward`` from the
batch's key padding; the public entry point from a plain tensor, ``is_causal=`` or a ``SparsePattern``) and passed
down unchanged: nothing downstream re-derives the key padding from a tensor's shape. The registry validates it once
per call (:meth:`AttnMask.check`), then gives each backend only the parts that backend declares it runs natively
(``Capabilities.mask_parts`` and ``Capabilities.patterns``), densifying the others into the tensor part once
(:meth:`AttnMask.for_backend`, remembered on the mask: a stack's mask is densified once for all its layers).
Consumers read it three ways: :meth:`dense` (the reference formula), :meth:`mask_mod`
/ :meth:`score_mod` (FlexAttention), or the fields themselves (sparse and linear kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Collection

import torch
from torch import Tensor

from . import masks as _masks
from .patterns import SparsePattern

# What a backend may declare in ``Capabilities.mask_parts`` (SparsePattern kinds go in ``Capabilities.patterns``).
PARTS = {
    "tensor": "a dense bool/float mask broadcastable to (B, H, Lq, Lk) (every other part can be densified into it)",
    "key_padding": "(B, Lk) bool, True = real key",
    "causal": "causal at any offset, together with the backend's other native parts",
    "causal_square": "causal with Lq == Lk and offset 0, together with the backend's other native parts",
    "causal_alone": "causal with Lq == Lk and offset 0 as the only part (a kernel flag such as SDPA's is_causal)",
    "alibi": "ALiBi distance biases, one slope per head (a score_mod for FlexAttention)",
}
_WORDS = {
    "tensor": "dense masks",
    "key_padding": "key-padding masks",
    "causal": "causal",
    "causal_square": "causal (Lq == Lk)",
    "causal_alone": "causal (Lq == Lk, alone)",
    "window": "window patterns",
    "block": "block patterns",
    "alibi": "ALiBi biases",
}


def split_parts(natives: Collection[str], parts: Collection[str], square_causal: bool) -> tuple[frozenset, frozenset]:
    """``(kept, densified)``: which of a mask's ``parts`` a backend declaring ``natives`` runs as they are, and which
    must be densified into its tensor part. The one rule both :meth:`Backend.why_not` and :meth:`AttnMask.for_backend`
    follow. ``square_causal``: the causal part has ``Lq == Lk`` and offset 0."""
    others = set(parts) - {"causal"}
    kept = {p for p in others if p in natives}
    rest = others - kept
    if "causal" in parts:
        alone_ok = "causal_alone" in natives and not kept and not rest
        if "causal" in natives or (square_causal and ("causal_square" in natives or alone_ok)):
            kept.add("causal")
        else:
            rest.add("causal")
    return frozenset(kept), frozenset(rest)  # a kept tensor part absorbs the densified ones


def describe(parts: Collection[str], square_causal: bool = True) -> str:
    """Parts in words, for messages: ``describe({"key_padding", "causal_square"})`` -> "key-padding masks and causal
    (Lq == Lk)"; a call's causal part that is not square reads "causal with Lq != Lk or an offset"."""
    words = [
        _WORDS.get(p, p) if p != "causal" or square_causal else "causal with Lq != Lk or an offset"
        for p in sorted(parts)
    ]
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


@dataclass(frozen=True, eq=False)
class AttnMask:
    """A structured attention mask (see the module docstring). Immutable; ``with_*`` methods return new ones."""

    key_padding: Tensor | None = None  # (b, j) bool, True = real key
    causal: bool = False
    causal_offset: int | None = None  # query i sits at position i + offset; None = Lk - Lq (bottom right)
    pattern: SparsePattern | None = None  # geometry only (its causal flag is lifted into ``causal``)
    tensor: Tensor | None = None  # bool (True = may attend) or float (added), broadcastable to (b, h, i, j)
    alibi: tuple | None = None  # ALiBi slopes, one float per query head: -slope_h * |pos(i) - j| is added
    _checked: tuple = field(default=(), repr=False, compare=False)  # the (b, h, i, j, device, dtype) last checked
    _memo: dict | None = field(default=None, init=False, repr=False, compare=False)  # for_backend's results

    def __post_init__(self) -> None:
        if self.pattern is not None and self.pattern.causal:  # one causal flag, here
            object.__setattr__(self, "causal", True)
            object.__setattr__(self, "pattern", replace(self.pattern, causal=False))
        if self.causal_offset is not None and not isinstance(self.causal_offset, int):
            raise TypeError(
                f"causal_offset must be an int (query i sits at key position i + offset), got "
                f"{type(self.causal_offset).__name__}"
            )
        if self.alibi is not None:
            slopes = self.alibi.tolist() if isinstance(self.alibi, Tensor) else self.alibi
            object.__setattr__(self, "alibi", tuple(float(x) for x in slopes))
        kp = self.key_padding
        if kp is not None and not isinstance(kp, Tensor):
            raise TypeError(
                f"key_padding_mask must be a torch.Tensor, (B, Lk) bool with True = real token; got "
                f"{type(kp).__module__}.{type(kp).__name__}: convert it with torch.as_tensor(mask)"
            )
        if self.tensor is not None and not isinstance(self.tensor, Tensor):
            raise TypeError(
                f"mask must be a torch.Tensor; got {type(self.tensor).__module__}."
                f"{type(self.tensor).__name__}: convert it with torch.as_tensor(mask)"
            )
        if kp is not None and kp.dtype != torch.bool:  # a 0/1 float mask would be added to the scores as a bias
            raise TypeError(
                f"key_padding_mask must be bool (True = real token), got {kp.dtype}. An HF-style 0/1 attention_mask "
                "converts with `key_padding_mask=attention_mask.bool()`; PyTorch's True = padding with `~mask`; an "
                "additive float bias goes in `mask=`"
            )
        if kp is not None and kp.dim() != 2:
            raise ValueError(f"key_padding_mask must be (B, Lk) with True = real token, got shape {tuple(kp.shape)}")

    # ------------------------------------------------------------------ building
    @classmethod
    def of(cls, mask=None, *, is_causal: bool = False, key_padding: Tensor | None = None) -> AttnMask | None:
        """The structured form of what callers pass: ``None``, a bool/float tensor, a :class:`SparsePattern`, or an
        ``AttnMask``; ``is_causal`` and ``key_padding`` add those parts. Returns None when nothing is masked."""
        if isinstance(mask, AttnMask):
            out = mask
        elif isinstance(mask, SparsePattern):
            out = cls(pattern=mask)
        elif mask is None:
            out = cls()
        elif isinstance(mask, Tensor):
            out = cls(tensor=mask)
        else:
            raise TypeError(f"mask must be a tensor, a SparsePattern or an AttnMask, got {type(mask).__name__}")
        if is_causal and not out.causal:
            out = replace(out, causal=True, _checked=())
        if key_padding is not None:
            if out.key_padding is not None:
                raise ValueError(
                    "two key-padding masks for one call: pass it once (key_padding_mask= or the AttnMask's key_padding)"
                )
            out = replace(out, key_padding=key_padding, _checked=())
        return out if out.parts else None

    def with_alibi(self, slopes) -> AttnMask:
        """This mask with the ALiBi part ``slopes`` (one per query head; a tuple, list or tensor); the same mask when
        it already has them (a stack's mask passed through every layer keeps its validation and dense form)."""
        slopes = (
            None
            if slopes is None
            else tuple(float(x) for x in (slopes.tolist() if isinstance(slopes, Tensor) else slopes))
        )
        return self if slopes == self.alibi else replace(self, alibi=slopes, _checked=())

    def with_pattern(self, pattern: SparsePattern | None) -> AttnMask:
        if pattern is None or (self.pattern == replace(pattern, causal=False) and self.causal >= pattern.causal):
            return self  # already there (a model's mask passed through every layer keeps its validation)
        if self.pattern is not None and self.pattern != replace(pattern, causal=False):
            raise ValueError("two sparse patterns for one call: the module's pattern= and the mask's")
        return replace(self, pattern=pattern, _checked=())

    # ------------------------------------------------------------------ reading
    @property
    def parts(self) -> frozenset:
        """The parts present: names from :data:`PARTS` (``causal`` for any causal) and the pattern's kind."""
        p = set()
        if self.tensor is not None:
            p.add("tensor")
        if self.key_padding is not None:
            p.add("key_padding")
        if self.causal:
            p.add("causal")
        if self.pattern is not None:
            p.add(self.pattern.kind)
        if self.alibi is not None:
            p.add("alibi")
        return frozenset(p)

    def offset(self, lq: int, lk: int) -> int:
        """The causal offset: query ``i`` may attend keys ``j <= i + offset``."""
        return lk - lq if self.causal_offset is None else self.causal_offset

    def square_causal(self, lq: int, lk: int) -> bool:
        return self.causal and lq == lk and self.offset(lq, lk) == 0

    # ------------------------------------------------------------------ validation (once per call)
    def check(self, b: int, h: int, lq: int, lk: int, device: torch.device, dtype: torch.dtype) -> AttnMask:
        """Validate every part against ``(B, H, Lq, Lk)`` on ``device`` (errors name the fix); a float tensor part is
        cast to ``dtype``. Returns the checked mask; checking it again for the same call shape costs nothing."""
        target = (b, h, lq, lk, str(device), dtype)
        if self._checked == target:
            return self
        t = self.tensor
        if t is not None:
            _masks.check_mask(t, (b, h, lq, lk))
            if t.device != device:
                raise ValueError(f"mask is on {t.device} but q is on {device}; move it with mask.to(q.device)")
            if t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
        kp = self.key_padding
        if kp is not None:
            if tuple(kp.shape) != (b, lk):
                raise ValueError(
                    f"key_padding_mask must be (B, Lk)=({b}, {lk}) with True = real token, got shape {tuple(kp.shape)}"
                )
            if kp.device != device:
                raise ValueError(f"key_padding_mask is on {kp.device} but q is on {device}; move it with .to(q.device)")
            _masks.warn_if_inverted_padding(kp)
        if self.alibi is not None and len(self.alibi) != h:
            raise ValueError(
                f"the mask's ALiBi part has {len(self.alibi)} slopes but the call has {h} query heads; "
                "give one slope per head (multihead.modules.attention.alibi_slopes(num_heads))"
            )
        if self.pattern is not None and lq != lk:
            raise ValueError(
                f"SparsePattern masks describe self-attention (Lq == Lk); got Lq={lq}, Lk={lk}. Build "
                "cross-attention without pattern="
            )
        if self.pattern is not None and self.causal and self.offset(lq, lk) != 0:
            raise ValueError("a SparsePattern's causal rule has offset 0; drop causal_offset= or the pattern")
        if t is self.tensor:  # remember on this very object: a mask shared by every layer is checked once
            object.__setattr__(self, "_checked", target)
            return self
        return replace(self, tensor=t, _checked=target)

    # ------------------------------------------------------------------ dense form
    def alibi_bias(self, lq: int, lk: int, device=None, dtype=torch.float32) -> Tensor:
        """The ALiBi part as a float bias ``(1, H, Lq, Lk)``: ``-slope_h |pos(i) - j|``, ``pos(i) = i + offset``."""
        pos = torch.arange(lq, device=device) + self.offset(lq, lk)
        dist = (pos[:, None] - torch.arange(lk, device=device)[None, :]).abs().to(torch.float64)  # (i, j)
        slopes = torch.tensor(self.alibi, dtype=torch.float64, device=device)
        return (-slopes[:, None, None] * dist)[None].to(dtype)  # (1, h, i, j)

    def dense(self, lq: int, lk: int, device=None) -> Tensor | None:
        """Every part merged into one tensor broadcastable to ``(B, H, Lq, Lk)``: bool (True = may attend), or
        float when the tensor part is a float bias or there is an ALiBi part (-inf where a bool part forbids; the
        tensor part's float dtype, else fp32). None when nothing is masked."""
        out = self.tensor
        if self.alibi is not None:
            dtype = out.dtype if out is not None and out.is_floating_point() else torch.float32
            out = _masks.merge_masks(self.alibi_bias(lq, lk, device, dtype), out)
        if self.key_padding is not None:
            out = _masks.merge_masks(out, self.key_padding[:, None, None, :].to(device))  # (b, 1, 1, j)
        if self.pattern is not None:
            out = _masks.merge_masks(out, self.pattern.dense(lq, device=device))  # (i, j)
        if self.causal:
            out = _masks.merge_masks(out, _masks.causal_mask(lq, lk, offset=self.offset(lq, lk), device=device))
        return out

    def for_backend(self, natives: Collection[str], lq: int, lk: int, device=None) -> AttnMask | None:
        """This mask as a backend declaring ``natives`` (``mask_parts`` + ``patterns``) takes it: its native parts
        as they are, the rest densified into the tensor part, once. A causal part that forbids nothing (every query
        at or after the last key: one decoding step over its cache) is dropped first. Remembered on this mask: a
        stack's mask is densified once for all its layers."""
        key = (tuple(natives), self.cache_key(lq, lk, device))
        memo = self._memo
        if memo is not None and key in memo:
            return memo[key]
        out = self._for_backend(natives, lq, lk, device)
        if memo is None:
            memo = {}
            object.__setattr__(self, "_memo", memo)
        memo.clear()  # one entry: the call shape of a stack's layers (a new length gets a new mask)
        memo[key] = out
        return out

    def _for_backend(self, natives: Collection[str], lq: int, lk: int, device=None) -> AttnMask | None:
        if self.causal and self.pattern is None and self.offset(lq, lk) >= lk - 1:
            rest_of = replace(self, causal=False, causal_offset=None, _checked=self._checked)
            return rest_of.for_backend(natives, lq, lk, device) if rest_of.parts else None
        kept, rest = split_parts(natives, self.parts, self.square_causal(lq, lk))
        if not rest:
            return self
        drop = replace(
            self,
            key_padding=self.key_padding if "key_padding" in kept else None,
            causal=self.causal and "causal" in kept,
            alibi=self.alibi if "alibi" in kept else None,
            pattern=self.pattern if self.pattern is not None and self.pattern.kind in kept else None,
            tensor=None,
            _checked=(),
        )
        moved = replace(
            self,
            key_padding=None if "key_padding" in kept else self.key_padding,
            causal=self.causal and "causal" not in kept,
            alibi=None if "alibi" in kept else self.alibi,
            pattern=None if self.pattern is not None and self.pattern.kind in kept else self.pattern,
            _checked=(),
        )
        return replace(drop, tensor=moved.dense(lq, lk, device), _checked=self._checked)

    # ------------------------------------------------------------------ FlexAttention form
    def mask_mod(self, lq: int, lk: int, device=None):
        """``mask_mod(b, h, q_idx, kv_idx) -> bool`` over the bool parts (None when there are none): the pattern's
        rule, the causal rule, key padding and a bool tensor, each evaluated on FlexAttention's indices."""
        rules = []
        if self.pattern is not None:
            rule = self.pattern.rule(lq, device)
            rules.append(lambda b, h, i, j: rule(i, j))
        if self.causal:
            off = self.offset(lq, lk)
            rules.append(lambda b, h, i, j: _masks.causal_allowed(i, j, off))
        if self.key_padding is not None:
            kp = self.key_padding.to(device)
            lengths = kp.sum(1)  # (b,)
            if torch.equal(kp, torch.arange(kp.shape[1], device=kp.device)[None, :] < lengths[:, None]):
                rules.append(lambda b, h, i, j: j < lengths[b])  # right padding: one length per batch row
            else:
                rules.append(lambda b, h, i, j: kp[b, j])
        if self.tensor is not None and self.tensor.dtype == torch.bool:
            rules.append(_lookup(self.tensor, lq, lk))
        if not rules:
            return None

        def mask_mod(b, h, i, j):
            ok = rules[0](b, h, i, j)
            for rule_ in rules[1:]:
                ok = ok & rule_(b, h, i, j)
            return ok

        return mask_mod

    def score_mod(self, lq: int, lk: int, device=None):
        """``score_mod(score, b, h, q_idx, kv_idx)`` adding a float tensor part and the ALiBi bias (None without
        either)."""
        mods = []
        if self.tensor is not None and self.tensor.dtype != torch.bool:
            bias = _lookup(self.tensor, lq, lk)
            mods.append(lambda score, b, h, i, j: score + bias(b, h, i, j))
        if self.alibi is not None:
            slopes = torch.tensor(self.alibi, device=device)
            off = self.offset(lq, lk)
            mods.append(lambda score, b, h, i, j: score - slopes[h] * (i + off - j).abs())
        if len(mods) < 2:
            return mods[0] if mods else None
        first, second = mods
        return lambda score, b, h, i, j: second(first(score, b, h, i, j), b, h, i, j)

    def mask_mod_axes(self) -> tuple[bool, bool]:
        """Whether :meth:`mask_mod` depends on the batch and on the head index (block masks are built per axis)."""
        t = self.tensor if self.tensor is not None and self.tensor.dtype == torch.bool else None
        t4 = None if t is None else t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
        per_batch = self.key_padding is not None or (t4 is not None and t4.shape[0] > 1)
        return per_batch, t4 is not None and t4.shape[1] > 1

    def cache_key(self, lq: int, lk: int, device) -> tuple:
        """Equal keys mean equal masks: the geometry, plus each tensor's storage, layout and version counter (bumped
        by every in-place write, so an edited, reused buffer never matches a stale entry)."""
        return (
            self.pattern,
            self.causal,
            self.offset(lq, lk) if self.causal or self.alibi is not None else None,
            self.alibi,
            _identity(self.key_padding),
            _identity(self.tensor),
            lq,
            lk,
            str(device),
        )


def _identity(t: Tensor | None) -> tuple | None:
    if t is None:
        return None
    return (t.data_ptr(), tuple(t.shape), t.stride(), str(t.dtype), t._version)


def _lookup(t: Tensor, lq: int, lk: int):
    """``fn(b, h, i, j)`` indexing ``t`` (broadcastable to ``(b, h, i, j)``); size-1 axes index at 0."""
    t4 = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    t4 = t4.expand(t4.shape[0], t4.shape[1], lq, lk)
    tb, th = t4.shape[0] > 1, t4.shape[1] > 1
    return lambda b, h, i, j: t4[b if tb else 0, h if th else 0, i, j]


__all__ = ["AttnMask", "PARTS", "describe", "split_parts"]
