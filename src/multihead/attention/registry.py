"""The kernel seam: one ``attention(...)`` entry point over registered backends.

Shape legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads (``h % g == 0``: grouped-query attention),
``i`` query positions, ``j`` key positions, ``d`` head dim.

A backend is a plain function with one signature::

    fn(q, k, v, *, mask, is_causal, dropout_p, scale, need_weights) -> (out, weights | None)

    q: (b, h, i, d)   k, v: (b, g, j, d)   mask: None | bool/float broadcastable to (b, h, i, j)
    out: (b, h, i, d)  weights: (b, h, i, j) (only when need_weights and the backend declares it can)

The entry point does everything shared, once, so that backends stay small and all agree:

* validates shapes and masks (errors name the fix);
* resolves ``is_causal`` into the mask when a mask is also given or ``Lq != Lk`` (bottom-right alignment, see
  :func:`multihead.masks.causal_mask`), so backends only see ``is_causal=True`` for square, mask-free calls;
* makes fully masked query rows safe: they are opened before the backend runs and zeroed after, so their output,
  weights and gradients are exactly zero on every backend and dtype (PyTorch's MHA returns NaN there).

Modules pick a backend by name once; they never branch on it. ``backend="auto"`` takes the highest-priority
backend whose declared capabilities cover the call; :func:`explain` says why the others were skipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import torch
from torch import Tensor

from . import masks as _masks

BackendFn = Callable[..., "tuple[Tensor, Optional[Tensor]]"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can honour. ``auto`` only picks a backend whose capabilities cover the call."""

    returns_weights: bool = False
    supports_mask: bool = True
    supports_dropout: bool = True
    supports_gqa: bool = True
    exact: bool = True
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    patterns: tuple[str, ...] = ()  # SparsePattern kinds run natively (others get the pattern's dense mask)
    requires_pattern: bool = False  # runs only SparsePattern masks (sparse backends)
    backward_devices: tuple[str, ...] = ("cpu", "cuda")  # where gradients flow through it


@dataclass(frozen=True)
class Backend:
    name: str
    fn: BackendFn
    capabilities: Capabilities
    priority: int = 0  # higher is tried first by ``auto``
    description: str = ""
    available: Callable[[], Optional[str]] = field(default=lambda: None)  # returns a reason when unavailable
    check: Callable[["CallInfo"], Optional[str]] = field(default=lambda call: None)  # per-call reason, or None

    def why_not(self, call: "CallInfo") -> Optional[str]:
        """None when this backend can honour ``call``, else the reason it cannot."""
        unavailable = self.available()
        if unavailable:
            return unavailable
        c = self.capabilities
        if call.need_weights and not c.returns_weights:
            return "does not return attention weights (need_weights=True)"
        if call.has_mask and not c.supports_mask:
            return "does not support masks"
        if call.dropout_p > 0 and not c.supports_dropout:
            return "does not support attention dropout"
        if call.gqa and not c.supports_gqa:
            return "does not support grouped-query attention"
        if call.device not in c.devices:
            return f"does not run on {call.device}"
        if call.needs_grad and call.device not in c.backward_devices:
            return f"has no backward on {call.device} (inputs require grad)"
        if call.dtype not in c.dtypes:
            return f"does not support {call.dtype}"
        if call.exact and not c.exact:
            return "is approximate and the call requires exact attention"
        if c.requires_pattern and call.pattern not in c.patterns:
            return (f"runs only SparsePattern masks of kind {'/'.join(c.patterns)}; pass mask=SparsePattern(...)"
                    if call.pattern is None else f"does not run {call.pattern} patterns")
        return self.check(call)


@dataclass(frozen=True)
class CallInfo:
    device: str
    dtype: torch.dtype
    need_weights: bool
    has_mask: bool
    dropout_p: float
    gqa: bool
    exact: bool = True
    pattern: Optional[str] = None  # the SparsePattern kind, when the mask is one
    needs_grad: bool = False  # grad mode is on and an input requires grad
    sizes: tuple = ()  # (Lq, Lk, D): for backends whose correctness depends on the shape (see flex)


_REGISTRY: dict[str, Backend] = {}


def register_backend(
    name: str,
    capabilities: Capabilities,
    *,
    priority: int = 0,
    description: str = "",
    available: Callable[[], Optional[str]] | None = None,
    check: Callable[[CallInfo], Optional[str]] | None = None,
) -> Callable[[BackendFn], BackendFn]:
    """Decorator registering ``fn`` as attention backend ``name`` (see the module docstring for the signature)."""

    def deco(fn: BackendFn) -> BackendFn:
        if name in _REGISTRY:
            raise ValueError(f"attention backend {name!r} is already registered")
        _REGISTRY[name] = Backend(name, fn, capabilities, priority, description, available or (lambda: None),
                                  check or (lambda call: None))
        return fn

    return deco


def list_backends() -> dict[str, Backend]:
    """All registered backends by name."""
    return dict(_REGISTRY)


def get_backend(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {sorted(_REGISTRY)} or 'auto'"
        ) from None


def check_backend_name(name: str) -> str:
    if name != "auto":
        get_backend(name)
    return name


def _call_info(q: Tensor, k: Tensor, mask, dropout_p: float, need_weights: bool, exact: bool) -> CallInfo:
    from .patterns import SparsePattern

    return CallInfo(
        device=q.device.type,
        dtype=q.dtype,
        need_weights=need_weights,
        has_mask=mask is not None,
        dropout_p=dropout_p,
        gqa=q.shape[1] != k.shape[1],
        exact=exact,
        pattern=mask.kind if isinstance(mask, SparsePattern) else None,
        needs_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k)),
        sizes=(q.shape[2], k.shape[2], q.shape[3]),
    )


def resolve(name: str, call: CallInfo) -> Backend:
    """The backend that will run ``call``: ``name`` itself, or for ``auto`` the best capable one."""
    if name != "auto":
        backend = get_backend(name)
        reason = backend.why_not(replace(call, exact=False))  # naming an approximate backend is a choice
        if reason:
            capable = [b.name for b in _REGISTRY.values() if b.why_not(call) is None]
            raise ValueError(f"attention backend {name!r} {reason}; use backend='auto' or one of {capable}")
        return backend
    for backend in sorted(_REGISTRY.values(), key=lambda b: -b.priority):
        if backend.why_not(call) is None:
            return backend
    raise RuntimeError(f"no registered attention backend can run {call}")


def explain(q: Tensor, k: Tensor, *, mask=None, dropout_p: float = 0.0, need_weights: bool = False,
            exact: bool = True) -> list[tuple[str, Optional[str]]]:
    """For each backend in ``auto``'s order: ``(name, None)`` if capable, else ``(name, reason it was skipped)``."""
    call = _call_info(q, k, mask, dropout_p, need_weights, exact)
    return [(b.name, b.why_not(call)) for b in sorted(_REGISTRY.values(), key=lambda b: -b.priority)]


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (B, H, L, D), got shape {tuple(t.shape)}; "
                "split heads first, e.g. x.view(B, L, H, D).transpose(1, 2)"
            )
    b, h, _, d = q.shape
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on (B, H_kv, Lk)")
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch sizes differ: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"q head dim {d} != k head dim {k.shape[3]}: queries and keys must share D")
    if h % k.shape[1] != 0:
        raise ValueError(
            f"q has {h} heads, k/v have {k.shape[1]}: the number of query heads must be a multiple of the "
            "number of key/value heads (grouped-query attention)"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast them to one dtype")


def _prepare_mask(q: Tensor, k: Tensor, mask, is_causal: bool):
    """The one preparation step shared by :func:`attention` and :func:`attention_weights`: validate ``mask`` once
    (shape, dtype, device), turn a :class:`SparsePattern` into its dense mask, and fold ``is_causal`` into the mask
    when a mask is also given or ``Lq != Lk`` (bottom-right alignment). Returns ``(mask, is_causal)``; backends only
    ever see ``is_causal=True`` for square, mask-free calls."""
    from .patterns import SparsePattern

    b, h, lq, _ = q.shape
    lk = k.shape[2]
    if isinstance(mask, SparsePattern):
        _check_pattern(mask, b, lq, lk)
        mask, is_causal = mask.with_causal(is_causal).dense(lq, device=q.device), False
    if mask is not None:
        _masks.check_mask(mask, (b, h, lq, lk))
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}; move it with mask.to(q.device)")
        if mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)
    if is_causal and (mask is not None or lq != lk):
        mask = _masks.merge_masks(mask, _masks.causal_mask(lq, lk, device=q.device))
        is_causal = False
    return mask, is_causal


def _check_pattern(pattern, b: int, lq: int, lk: int) -> None:
    if lq != lk:
        raise ValueError(f"SparsePattern masks describe self-attention (Lq == Lk); got Lq={lq}, Lk={lk}")
    if pattern.key_padding is not None and pattern.key_padding.shape != (b, lk):
        raise ValueError(f"the pattern's key_padding must be (B, L)=({b}, {lk}), got "
                         f"{tuple(pattern.key_padding.shape)}")


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
    backend: str = "auto",
    weights_hook: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``, over registered backends.

    Args:
        q: ``(B, H, Lq, D)`` queries.
        k: ``(B, Hkv, Lk, D)`` keys; ``H % Hkv == 0`` (``Hkv < H``: grouped-query / multi-query attention).
        v: ``(B, Hkv, Lk, Dv)`` values.
        mask: bool (True = may attend) or float (added to the scores), broadcastable to ``(B, H, Lq, Lk)``; or a
            :class:`~multihead.attention.patterns.SparsePattern` (self-attention): sparse backends run it without
            building ``Lq x Lk``, every other backend gets its dense mask.
        is_causal: forbid keys after each query, aligned to the bottom right when ``Lq != Lk``
            (see :func:`multihead.masks.causal_mask`). Combined with ``mask`` when both are given.
        dropout_p: dropout on the attention weights (pass 0 in eval).
        scale: score scale, default ``1 / sqrt(D)``.
        need_weights: also return the per-head weights ``(B, H, Lq, Lk)`` (before dropout).
        backend: a registered backend name, or ``"auto"``.
        weights_hook: ``fn(weights) -> weights``: the weights ``(B, H, Lq, Lk)`` are computed explicitly (the
            reference formula), passed through ``fn`` (which may read or edit them; a module's ``hook_pattern``),
            then dropout and the values are applied here -- the one place the hooked path lives.

    Returns:
        ``(out, weights)``: ``out`` is ``(B, H, Lq, Dv)``; ``weights`` is None unless ``need_weights``.
        Query rows with no allowed key give zeros in both.
    """
    from .ops import expand_kv, probabilities
    from .patterns import SparsePattern

    _check_qkv(q, k, v)
    b, h, lq, d = q.shape
    lk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if lq == 0 or lk == 0:  # nothing to attend (or no query): zeros, as for fully masked rows, on every backend
        out = (q[..., :1] * 0).expand(b, h, lq, v.shape[-1]) + v.sum() * 0  # keeps q and v in the graph
        return out, (q.new_zeros(b, h, lq, lk) if need_weights else None)
    if isinstance(mask, SparsePattern) and weights_hook is None:
        _check_pattern(mask, b, lq, lk)
        pattern = mask.with_causal(is_causal)
        chosen = resolve(backend, _call_info(q, k, pattern, dropout_p, need_weights, exact=True))
        if pattern.kind in chosen.capabilities.patterns:
            out, _ = chosen.fn(q, k, v, mask=pattern, is_causal=False, dropout_p=dropout_p, scale=scale,
                               need_weights=False)
            return out, None
        mask, is_causal, backend = pattern, False, chosen.name  # the chosen backend gets the dense equivalent
    mask, is_causal = _prepare_mask(q, k, mask, is_causal)

    if weights_hook is not None:  # explicit weights, edited by the hook; rows with no key are zero in them
        weights = weights_hook(probabilities(q, k, mask, scale, is_causal))  # (b, h, i, j)
        dropped = torch.nn.functional.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        return torch.matmul(dropped, expand_kv(v, h)), (weights if need_weights else None)  # (b, h, i, d)

    # Fully masked query rows: open them for the backend, zero them afterwards (no NaN, zero grads).
    row_ok = None
    if mask is not None:
        allowed = ~_masks.is_masked(mask)
        row_ok = allowed.any(dim=-1, keepdim=True)  # (b?, h?, i?, 1)
        if bool(row_ok.all()):
            row_ok = None
        elif mask.dtype == torch.bool:
            mask = mask | ~row_ok
        else:
            mask = mask.masked_fill(~row_ok, 0.0)

    chosen = resolve(backend, _call_info(q, k, mask, dropout_p, need_weights, exact=True))
    out, weights = chosen.fn(
        q, k, v, mask=mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale, need_weights=need_weights
    )
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
        if weights is not None:
            weights = weights.masked_fill(~row_ok, 0.0)
    return out, (weights if need_weights else None)


def attention_weights(q: Tensor, k: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
                      scale: float | None = None) -> Tensor:
    """Per-head weights ``softmax(q k^T * scale + mask)`` ``(B, H, Lq, Lk)``, fully masked rows zero: the same
    preparation as :func:`attention` (one validation, one causal merge), then the reference formula."""
    from .ops import probabilities

    _check_qkv(q, k, k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask, is_causal = _prepare_mask(q, k, mask, is_causal)
    return probabilities(q, k, mask, scale, is_causal)
