"""One CPU decoding fast path shared by the feed-forward, attention and output layers.

A decoding step multiplies one row by every weight of the model: it is bound by how fast the weights stream from
memory, and this CPU's BLAS streams a weight stored ``in x out`` (the transpose contiguous, ``x @ W^T``) about
twice as fast as one stored ``out x in`` (``F.linear(x, W)``): 16.9 against 7.4 GB/s over SmolLM2-135M's 538 MB
on 2 threads. :func:`prepare` lays a model's weights out that way once, in place and with no copy kept: each
``nn.Linear``'s weight becomes the transposed view of a contiguous ``in x out`` buffer (a column-major weight:
``F.linear`` then hands BLAS the fast layout by itself), and the weights one input feeds together -- q, k and v;
the gate and up projections of a gated feed-forward -- become column views of *one* buffer, so that each group is
one product (:func:`columns`). Every other path (batches, prefill, training) reads the same numbers; only the
order of the additions inside a product changes (logits within 1e-5).

``prepare(model, layout="rows")`` lays the same groups out as consecutive *row* blocks of one contiguous ``out x
in`` buffer instead (:func:`rows`): the layout the compiled decoding step of
:mod:`multihead.models.fast_decode` reads fastest (its row-by-row reduction streams a row-major weight at 22 GB/s
here, the BLAS's best product 14.5). A model keeps the layout it was last given.

Without :func:`prepare` (a model being trained, say), :func:`linear` still keeps a transposed contiguous copy of
each widening weight for rows of one or two tokens (``out > in``: measured 1.4-1.5x faster on a single row). It
applies only under ``torch.no_grad()`` on CPU. Turn both off with ``fastpath.ENABLED = False``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ENABLED = True
LAYOUT = True  # False: prepare() leaves the weights as they are (the transposed copies of linear() still apply)
LAYOUTS = ("columns", "rows")
_ROWS = "rows"  # kept in an owner's _transposed: its weights are row-major on purpose (no transposed copy)
ROWS = 2  # at most this many rows (tokens x batch) take the path; above it BLAS's own GEMM is as fast or faster


# What the decoding layout keeps per module, here rather than in the modules' own attributes (never a parameter,
# buffer or state-dict entry, and a copied model does not carry a stale one): the transposed copy of a weight (or
# _ROWS: laid out by rows on purpose), a packed q/k/v buffer, and each model's layout.
_TRANSPOSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LAYOUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def transposed_copy(owner) -> Tensor | None:
    """The transposed copy :func:`linear` keeps for ``owner`` (None: none kept)."""
    kept = _TRANSPOSED.get(owner)
    return kept[1] if isinstance(kept, tuple) else None


def packed(owner, tensors: Sequence[Tensor], make) -> tuple:
    """``make()``'s packed copy of ``tensors`` for ``owner``, made again when any of them changed (in place, or
    replaced); dropped by :func:`prepare`, which lays the originals out instead."""
    stamp = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
    kept = _PACKED.get(owner)
    if kept is None or kept[0] != stamp:
        kept = _PACKED[owner] = (stamp, make())
    return kept[1]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, owner) -> Tensor:
    """``F.linear(x, weight, bias)``, through the transposed copy kept on ``owner`` where it is faster (none is made
    for a weight :func:`prepare` laid out: its transpose is contiguous already)."""
    out_features, in_features = weight.shape
    if (
        not ENABLED
        or torch.is_grad_enabled()
        or x.device.type != "cpu"
        or out_features <= in_features
        or x.numel() > ROWS * in_features
        or weight.stride(0) == 1  # column-major: F.linear hands BLAS the fast layout itself
    ):
        return F.linear(x, weight, bias)
    kept = _TRANSPOSED.get(owner)
    if kept is _ROWS:  # laid out by rows on purpose: no transposed copy beside it
        return F.linear(x, weight, bias)
    stamp = (weight.data_ptr(), weight._version, weight.dtype, weight.shape)
    if kept is None or kept[0] != stamp:
        kept = _TRANSPOSED[owner] = (stamp, weight.detach().t().contiguous())
    y = x @ kept[1]
    return y if bias is None else y + bias


def _packed(weights: Sequence[Tensor], by_rows: bool) -> Tensor | None:
    """The one contiguous buffer ``weights`` (each ``out_i x in``) are consecutive blocks of -- rows of a
    ``(sum of outs) x in`` buffer, or columns of an ``in x (sum of outs)`` one -- or None if they are not."""
    first = weights[0]
    total, width = sum(w.shape[0] for w in weights), first.shape[1]
    offset = 0
    for w in weights:
        laid = w.is_contiguous() if by_rows else w.stride() == (1, total)
        if (
            w.dim() != 2
            or w.shape[1] != width
            or not laid
            or w.dtype != first.dtype
            or w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()  # adjacent is not enough
            or w.data_ptr() != first.data_ptr() + offset * (width if by_rows else 1) * first.element_size()
        ):
            return None
        offset += w.shape[0]
    if by_rows:
        return first.detach().as_strided((total, width), (width, 1))
    return first.detach().as_strided((width, total), (total, 1))


def columns(weights: Sequence[Tensor]) -> Tensor | None:
    """The one ``in x (out_1 + out_2 + ...)`` buffer that ``weights`` (each ``out_i x in``) are consecutive column
    views of, as :func:`prepare` packs them, or None if they are not (then each is multiplied on its own)."""
    return _packed(weights, by_rows=False)


def rows(weights: Sequence[Tensor]) -> Tensor | None:
    """The one contiguous ``(out_1 + out_2 + ...) x in`` buffer that ``weights`` (each ``out_i x in``) are
    consecutive row blocks of, as ``prepare(layout="rows")`` packs them, or None if they are not."""
    return _packed(weights, by_rows=True)


def pack_rows(linears: Sequence[nn.Linear]) -> None:
    """Store the weights of ``linears`` (one input each) as consecutive row blocks of one contiguous buffer."""
    if rows([m.weight for m in linears]) is not None:
        return
    with torch.no_grad():
        buffer = torch.cat([m.weight.detach() for m in linears], 0).contiguous()  # (sum of outs, in)
        start = 0
        for m in linears:
            m.weight.data = buffer[start : start + m.out_features]
            start += m.out_features


def pack_columns(linears: Sequence[nn.Linear]) -> None:
    """Store the weights of ``linears`` (one input each) as consecutive column views of one contiguous buffer."""
    if columns([m.weight for m in linears]) is not None:
        return
    with torch.no_grad():
        buffer = torch.cat([m.weight.detach().t() for m in linears], 1).contiguous()  # (in, sum of outs)
        start = 0
        for m in linears:
            m.weight.data = buffer[:, start : start + m.out_features].t()
            start += m.out_features


def prepare(model: nn.Module, layout: str | None = None) -> nn.Module:
    """Lay ``model``'s weights out for decoding, in place (see the module docstring). ``layout="columns"`` (the
    default): the groups a module names in its ``column_groups()`` packed into one buffer each, every other
    ``nn.Linear`` weight made column-major; ``"rows"``: the same groups packed as row blocks, every weight row-major.
    None keeps the layout ``model`` was last given (columns the first time). The parameters stay the same objects
    (tied weights stay tied). Cheap to repeat (what is laid out is left); a no-op when ``ENABLED`` or ``LAYOUT`` is
    False or the model is not on the CPU."""
    if layout not in (None, *LAYOUTS):
        raise ValueError(f"unknown decoding layout {layout!r}; choose one of {LAYOUTS}")
    layout = layout or _LAYOUT.get(model, "columns")
    if not ENABLED or not LAYOUT:
        return model
    if any(p.device.type != "cpu" for p in model.parameters()):
        return model
    by_rows = layout == "rows"
    for m in model.modules():
        _TRANSPOSED.pop(m, None)  # copies an earlier layout made: not needed any more
        _PACKED.pop(m, None)
        if by_rows and (isinstance(m, nn.Linear) or hasattr(m, "column_groups")):
            _TRANSPOSED[m] = _ROWS
        groups = getattr(m, "column_groups", None)
        for group in groups() if callable(groups) else ():
            if all(isinstance(linear, nn.Linear) for linear in group):  # weights stored in another format stay
                (pack_rows if by_rows else pack_columns)(group)
    if by_rows:
        _TRANSPOSED[model] = _ROWS  # an LM's own output product (fastpath.linear(..., owner=model))
    with torch.no_grad():
        for m in model.modules():
            if not isinstance(m, nn.Linear):
                continue
            if by_rows and not m.weight.is_contiguous() and rows([m.weight]) is None:
                m.weight.data = m.weight.detach().contiguous()
            elif not by_rows and m.weight.stride(0) != 1:
                m.weight.data = m.weight.detach().t().contiguous().t()
    _LAYOUT[model] = layout
    return model


__all__ = [
    "ENABLED",
    "LAYOUT",
    "LAYOUTS",
    "ROWS",
    "columns",
    "linear",
    "pack_columns",
    "pack_rows",
    "packed",
    "prepare",
    "rows",
    "transposed_copy",
]
