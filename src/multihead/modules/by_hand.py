"""Attention written by hand, told by its dataflow rather than by names (part of :mod:`.observe`): a product of two
tensors makes scores; elementwise ops, views, casts, joins and slices keep them scores; a softmax over their last
dimension makes weights; a product of the weights with the values makes the heads' outputs. :class:`_Flow` tags the
tensors of one forward so; :func:`_weights` and :func:`_values` serve such a call through its site's hook points in
the model's own arithmetic. :class:`ObserveError` is every refusal of the observer."""

from __future__ import annotations

import math


import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

# Attention written by hand: a product of two tensors (the scores), a softmax over their last dimension (the
# weights), and a product of the weights with the values (the heads' outputs).
_PRODUCTS = (torch.matmul, Tensor.matmul, Tensor.__matmul__, torch.bmm, Tensor.bmm, torch.baddbmm, Tensor.baddbmm)
_EINSUM = torch.einsum
_SOFTMAX = (F.softmax, torch.softmax, Tensor.softmax)
# arithmetic that combines two tensors elementwise (not a cast or a view "as" another: type_as, view_as, expand_as)
_COMBINE = tuple(
    getattr(owner, name)
    for owner in (torch, Tensor)
    for name in ("add", "sub", "mul", "div", "where", "lerp", "addcmul", "maximum", "minimum")
    if hasattr(owner, name)
) + tuple(
    getattr(Tensor, f"__{op}__")
    for op in ("add", "radd", "iadd", "sub", "rsub", "isub", "mul", "rmul", "imul", "truediv", "rtruediv", "itruediv")
)
# learned projections: a linear layer (features last) or a convolution (channels second)
_MIXERS = (F.linear, F.conv1d, F.conv2d)
_JOINS = (torch.cat, torch.concat, torch.stack, F.pad)  # outputs that hold their inputs' elements among others
# "mixed": scores or weights passed through a learned projection (heads or positions mixed: talking-heads attention)
_RANK = {"weights": 0, "weights-part": 0, "mixed-weights": 0, "scores": 1, "mixed": 1, "projected": 2}
# outputs that are parts of their input (a slice of weights is still weights)
_PARTS = (
    Tensor.__getitem__,
    torch.narrow,
    Tensor.narrow,
    torch.split,
    Tensor.split,
    torch.chunk,
    Tensor.chunk,
    torch.unbind,
    Tensor.unbind,
    torch.tensor_split,
    Tensor.tensor_split,
)


class _ByHand:
    """The ``func`` of a site whose attention is written by hand: ``softmax(q k^T ...) v`` from products."""

    def __repr__(self) -> str:
        return "softmax(q k^T) v"


BY_HAND = _ByHand()


class ObserveError(ValueError):
    """A model or a call the observer cannot serve; the message says why."""


def _tensors(args, kwargs) -> list[Tensor]:
    return [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]


class _Flow:
    """Which tensors of one forward are scores (a product of two tensors, or made from scores elementwise, by a view
    or a cast) and which are weights (a softmax of scores over their last dimension, or made from weights the same
    way). A tag lives as long as its tensor."""

    def __init__(self) -> None:
        self.tags = WeakIdKeyDictionary()

    def weights_in(self, args, kwargs) -> tuple[Tensor | None, tuple | None]:
        """The first weights among a call's tensors, and their tag ``("weights", owner, (B, H, Lq, Lk))``."""
        for t in _tensors(args, kwargs):
            tag = self.tags.get(t)
            if tag is not None and tag[0] == "weights":
                return t, tag
        return None, None

    def part_in(self, args, kwargs):
        """The event whose weights, cut, padded or joined with others, are among a call's tensors (None: none)."""
        for t in _tensors(args, kwargs):
            tag = self.tags.get(t)
            if tag is not None and tag[0] == "weights-part":
                return tag[1]
        return None

    def mixed_in(self, args, kwargs) -> bool:
        """Whether a call's tensors hold weights made from scores mixed by a learned projection."""
        return any((tag := self.tags.get(t)) is not None and tag[0] == "mixed-weights" for t in _tensors(args, kwargs))

    def softmax_of_mixed(self, func, args, kwargs) -> bool:
        """Whether this call is a softmax, over the last dimension, of scores mixed by a learned projection
        (talking-heads attention)."""
        if func not in _SOFTMAX or not args or not isinstance(args[0], Tensor):
            return False
        tag = self.tags.get(args[0])
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        return tag is not None and tag[0] == "mixed" and dim in (-1, args[0].dim() - 1)

    def softmax_of_scores(self, func, args, kwargs) -> tuple | None:
        """The scores' tag ``("scores", product, its args, its kwargs)`` where this call is a softmax of scores over their last
        dimension; else None."""
        if func not in _SOFTMAX or not args or not isinstance(args[0], Tensor):
            return None
        tag = self.tags.get(args[0])
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if tag is None or tag[0] != "scores" or dim not in (-1, args[0].dim() - 1):
            return None
        return tag

    def follow(self, func, args, kwargs, out) -> None:
        """After ``out = func(*args, **kwargs)`` (not a softmax of scores, not weights times values): a product's
        output is scores, a linear projection's is projected; an output of as many elements as a tagged input, or
        joining it with others (``cat``, ``stack``, ``pad``), keeps its tag, weights before scores before projected
        (``scores + bias`` stays scores whatever made the bias)."""
        if func in _PARTS and isinstance(out, (tuple, list)):  # split, chunk, unbind: every part keeps the tag
            for part in out:
                self.follow(func, args, kwargs, part)
            return
        if not isinstance(out, Tensor):
            return
        if func in _PRODUCTS or func is _EINSUM:
            self.tags[out] = ("scores", func, args, kwargs)
            return
        if func in _MIXERS:
            made = self.tags.get(args[0]) if args and isinstance(args[0], Tensor) else None
            kind = made[0] if made is not None else None
            if kind in ("weights", "mixed-weights"):  # weights mixed after the softmax
                self.tags[out] = ("mixed-weights",)
            else:  # scores mixed across heads before a softmax, or a projection of anything else
                axis = -1 if func is F.linear else 1  # a convolution reads channels (the heads, for talking heads)
                mixes = out.shape == args[0].shape and _mixes_scores(made, args[0], axis)  # heads to heads
                self.tags[out] = ("mixed",) if mixes else ("projected",)
            return
        joins = func in _JOINS or func in _PARTS
        best = None
        tensors = _tensors(args, kwargs)
        for t in tensors:
            tag = self.tags.get(t)
            if tag is not None and (joins or out.numel() == t.numel()):
                if tag[0] == "weights" and out.numel() != t.numel():  # weights cut, padded or joined with others
                    tag = ("weights-part", tag[1])
                elif (
                    tag[0] == "weights"
                    and func in _COMBINE
                    and any(u is not t and u.numel() == t.numel() and u in self.tags for u in tensors)
                ):  # weights mixed elementwise with another distribution of their size (gated positional attention)
                    tag = ("weights-part", tag[1])
                if best is None or _RANK[tag[0]] < _RANK[best[0]]:
                    best = tag
        if best is not None:
            self.tags[out] = best


def _mixes_scores(made: tuple | None, x: Tensor, axis: int) -> bool:
    """Whether a linear projection of ``x`` mixes scores across one of their axes other than the keys' (the heads,
    as talking-heads attention does): ``x`` holds a product's elements, and the projection reads as many features as
    one of the product's leading axes has (``axis``: where the projection reads its features). (Scores carried into a residual stream and projected there are not.)"""
    if made is None or made[0] not in ("scores", "mixed"):
        return False
    if made[0] == "mixed":
        return True
    _, func, args, kwargs = made
    if func is _EINSUM:
        return False
    try:
        a, b = (_arg(args, kwargs, place) for place in _operands(func, args, kwargs))
        shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    except (IndexError, KeyError, RuntimeError, AttributeError):
        return False
    return x.numel() == math.prod(shape) and x.shape[axis] in shape[:-1] and x.shape[axis] != shape[-1]


def weights_first(func, args, kwargs, weights: Tensor) -> bool:
    """Whether a product multiplies ``weights @ values`` (an einsum names its axes, so either order serves)."""
    if func is _EINSUM:
        return True
    return _arg(args, kwargs, _operands(func, args, kwargs)[0]) is weights


def _operands(func, args, kwargs) -> list[int | str]:
    """Where a product's two operands are among its arguments: a position, or a keyword (``baddbmm``'s ``batch1``
    and ``batch2`` are often passed by name)."""
    first = 1 if func in (torch.baddbmm, Tensor.baddbmm) else 0
    if first:
        names = ("batch1", "batch2")
    elif func in (torch.bmm, Tensor.bmm):
        names = ("input", "mat2")
    else:
        names = ("input", "other")
    return [first + i if first + i < len(args) else name for i, name in enumerate(names)]


def _arg(args, kwargs, place: int | str):
    return args[place] if isinstance(place, int) else kwargs[place]


def _weights(site, weights: Tensor, scores: tuple) -> Tensor:
    """A softmax written by hand, through ``site``'s hook points: ``hook_pattern`` on the weights; ``hook_q`` and
    ``hook_k`` read the operands of the product that made the scores."""
    flat = site.flat and weights.dim() == 3 and weights.shape[0] % site.num_heads == 0
    if flat:  # (batch * heads, Lq, Lk), as in the probe pass
        shaped = weights.view(weights.shape[0] // site.num_heads, site.num_heads, *weights.shape[1:])
    elif site.flat or weights.dim() != 4 or weights.shape[1] != site.num_heads:
        raise ObserveError(
            f"{site.name} computes weights of shape {tuple(weights.shape)}, where the probe pass saw {site.num_heads} "
            "heads (batch, heads, queries, keys): the model changed shape since it was observed; observe it again"
        )
    else:
        shaped = weights
    if site.hook_stats.active:
        raise ObserveError(
            f"{site.name} computes its attention by hand (matmul, softmax, matmul): hook_stats is not served there; "
            "capture the pattern instead"
        )
    if site.hook_q.active or site.hook_k.active:
        _, product, args, kwargs = scores
        if product is _EINSUM:
            raise ObserveError(
                f"{site.name} makes its scores with torch.einsum: hook_q and hook_k are not served there (hook_pattern and "
                "hook_z are)"
            )
        q, k_t = (_arg(args, kwargs, at) for at in _operands(product, args, kwargs))
        b, h, lq, lk = shaped.shape
        q4 = q.reshape(b, h, lq, q.numel() // (b * h * lq))
        k4 = k_t.transpose(-1, -2).reshape(b, h, lk, k_t.numel() // (b * h * lk))
        if site.hook_q(q4) is not q4 or site.hook_k(k4) is not k4:
            raise ObserveError(
                f"{site.name} computes its attention by hand (matmul, softmax, matmul): hook_q and hook_k can read its "
                "queries and keys but not change them (its scale and mask are applied between); change hook_pattern, "
                "hook_v or hook_z instead"
            )
    if not site.hook_pattern.active:
        return weights
    return site.hook_pattern(shaped).reshape(weights.shape)


def _einsum_z(equation: str, operand: int) -> tuple[int, ...] | None:
    """The permutation taking an einsum's output to ``(B, H, Lq, D)`` where operand ``operand`` is the weights
    ``(B, H, Lq, Lk)``; None where the equation has no explicit output or an ellipsis."""
    if "->" not in equation or "." in equation:
        return None
    ins, out = equation.replace(" ", "").split("->")
    letters = ins.split(",")
    if len(letters) != 2 or len(letters[operand]) != 4 or len(out) != 4:
        return None
    w = letters[operand]
    b, h, q = w[0], w[1], w[2]
    rest = [c for c in out if c not in (b, h, q)]
    if any(c not in out for c in (b, h, q)) or len(rest) != 1:
        return None
    return tuple(out.index(c) for c in (b, h, q, rest[0]))


def _values(site, shape: torch.Size, weights: Tensor, func, args, kwargs) -> Tensor:
    """Weights times values written by hand, through ``site``'s hook points: ``hook_v`` on the values and
    ``hook_z`` on the heads' outputs, each seen as ``(B, H, L, D)``."""
    if not (site.hook_v.active or site.hook_z.active):
        return func(*args, **kwargs)
    b, h, lq, lk = shape
    if func is _EINSUM:
        equation, operands = (
            args[0],
            list(args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]),
        )
        at = next((i for i, t in enumerate(operands) if t is weights), None)
        perm = None if at is None else _einsum_z(equation, at)
        if perm is None or site.hook_v.active:
            raise ObserveError(
                f"{site.name} multiplies its weights and values with torch.einsum({equation!r}): hook_v is not served "
                "there, and hook_z only for an equation of two 4-D operands with an explicit output"
            )
        out = func(equation, *operands, **kwargs)
        z = site.hook_z(out.permute(*perm))
        return z.permute(*[perm.index(i) for i in range(4)])
    args, kwargs = list(args), dict(kwargs)
    left, right = _operands(func, args, kwargs)
    if _arg(args, kwargs, left) is not weights:
        raise ObserveError(
            f"{site.name} multiplies its values by its weights from the left; the observer serves weights @ values"
        )
    if site.hook_v.active:
        v = _arg(args, kwargs, right)
        v = site.hook_v(v.reshape(b, h, lk, v.numel() // (b * h * lk))).reshape(v.shape)
        if isinstance(right, int):
            args[right] = v
        else:
            kwargs[right] = v
    out = func(*args, **kwargs)
    if site.hook_z.active:
        out = site.hook_z(out.reshape(b, h, lq, out.numel() // (b * h * lq))).reshape(out.shape)
    return out
