"""The kernel seam: one ``attention(...)`` entry point over registered backends.

Shape legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads (``h % g == 0``: grouped-query attention),
``i`` query positions, ``j`` key positions, ``d`` head dim.

A backend is a plain function with one signature::

    fn(q, k, v, *, mask, dropout_p, scale, need_weights) -> (out, weights | None)
    (a backend declaring ``Capabilities.sinks`` also takes ``sinks=``: ``(h,)`` logits, or None)

    q: (b, h, i, d)   k, v: (b, g, j, d)   mask: None | AttnMask holding only the parts the backend declared
    out: (b, h, i, d)  weights: (b, h, i, j) (only when need_weights and the backend declares it can)

The entry point does everything shared, once, so that backends stay small and all agree:

* converts what the caller passed (a tensor, ``is_causal=``, a ``SparsePattern``, an ``AttnMask``) into one
  :class:`~multihead.attention.attn_mask.AttnMask` and validates it once (errors name the fix);
* hands the chosen backend the parts it declared native (``Capabilities.mask_parts``, ``.patterns``) and densifies
  the rest into the mask's tensor part, once (:meth:`AttnMask.for_backend`);
* gives learned sinks (a logit per head that joins every softmax denominator) to the backends that declare them and
  rewrites the call as one extra key for the others (:func:`~multihead.attention.ops.with_sink_key`), exactly;
* makes fully masked query rows of that tensor part safe: opened before the backend runs and zeroed after
  (:func:`~multihead.attention.ops.open_empty_rows`), so their output, weights and gradients are exactly zero on every
  backend and dtype (PyTorch's MHA returns NaN there). Backends that take parts natively zero such rows themselves
  (a contract the backend test matrix checks).

Modules pick a backend by name once; they never branch on it. ``backend="auto"`` takes the highest-ranked backend
whose declared capabilities cover the call. A backend's rank is its ``priority``, raised for the calls it is fastest
at by its ``boost`` (e.g. FlexAttention for sparse patterns on CUDA, where its compiled kernel with the pattern's
block mask beats our own window kernel; on CPU the window kernel stays first). :func:`explain` lists the backends in
that order with the reason each capable one was skipped; :func:`explain_choice` says it in one sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from collections.abc import Callable

import torch
from torch import Tensor

from .attn_mask import AttnMask, describe, split_parts

BackendFn = Callable[..., "tuple[Tensor, Tensor | None]"]


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
    mask_parts: tuple[str, ...] = ("tensor", "causal_alone")  # AttnMask parts run natively (see attn_mask.PARTS)
    patterns: tuple[str, ...] = ()  # SparsePattern kinds run natively (others get the pattern's dense mask)
    requires_pattern: bool = False  # runs only SparsePattern masks (sparse backends)
    backward_devices: tuple[str, ...] = ("cpu", "cuda")  # where gradients flow through it
    sinks: bool = False  # takes learned sinks natively (others run them as one extra key, rewritten by the seam)
    nan_rows: bool = True  # a query row holding NaN comes out NaN (else the seam makes it so: one answer everywhere)


@dataclass(frozen=True)
class Backend:
    name: str
    fn: BackendFn
    capabilities: Capabilities
    priority: int = 0  # higher is tried first by ``auto``
    description: str = ""
    available: Callable[[], str | None] = field(default=lambda: None)  # returns a reason when unavailable
    check: Callable[[CallInfo], str | None] = field(default=lambda call: None)  # per-call reason, or None
    # per-call rank raise and its reason (``(extra, why)``), or None: the calls this backend is fastest at
    boost: Callable[[CallInfo], tuple[int, str] | None] = field(default=lambda call: None)

    def rank(self, call: CallInfo) -> tuple[int, str | None]:
        """``(rank, why)``: ``auto`` tries higher ranks first; ``why`` says what raised it above ``priority``."""
        up = self.boost(call)
        return (self.priority, None) if up is None else (self.priority + up[0], up[1])

    def why_not(self, call: CallInfo) -> str | None:
        """None when this backend can honour ``call``, else the reason it cannot."""
        unavailable = self.available()
        if unavailable:
            return unavailable
        c = self.capabilities
        if call.need_weights and not c.returns_weights:
            return "does not return attention weights (need_weights=True)"
        if call.mask_parts and not c.supports_mask:
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
        if call.sinks and not c.sinks:  # the seam's rewrite: one extra key, the causal rule shifted by one
            if call.pattern is not None:
                return "cannot add learned sinks to a sparse pattern (the pattern's rule has no sink key)"
            if not c.exact:
                return "cannot take learned sinks (an approximate kernel would not keep the sink's share exact)"
            lq, lk, d = call.sizes if call.sizes else (0, 0, 0)
            call = replace(call, square_causal=False, sizes=(lq, lk + 1, d + 1) if call.sizes else ())
        if c.requires_pattern and call.pattern not in c.patterns:
            return (
                f"runs only SparsePattern masks of kind {'/'.join(c.patterns)}; pass mask=SparsePattern(...)"
                if call.pattern is None
                else f"does not run {call.pattern} patterns"
            )
        natives = c.mask_parts + c.patterns
        _, rest = split_parts(natives, call.mask_parts, call.square_causal)
        if rest and "tensor" not in natives:
            return f"takes only {describe(natives)}, not {describe(rest, call.square_causal)}"
        return self.check(call)


@dataclass(frozen=True)
class CallInfo:
    device: str
    dtype: torch.dtype
    need_weights: bool
    mask_parts: frozenset  # the AttnMask's parts (attn_mask.PARTS names, "causal", the pattern's kind)
    dropout_p: float
    gqa: bool
    exact: bool = True
    pattern: str | None = None  # the SparsePattern kind, when the mask has one
    square_causal: bool = False  # the causal part has Lq == Lk and offset 0
    needs_grad: bool = False  # grad mode is on and an input requires grad
    sizes: tuple = ()  # (Lq, Lk, D): for backends whose correctness depends on the shape (see flex)
    sinks: bool = False  # learned sinks (a logit per head in every softmax denominator)


_REGISTRY: dict[str, Backend] = {}


def register_backend(
    name: str,
    capabilities: Capabilities,
    *,
    priority: int = 0,
    description: str = "",
    available: Callable[[], str | None] | None = None,
    check: Callable[[CallInfo], str | None] | None = None,
    boost: Callable[[CallInfo], tuple[int, str] | None] | None = None,
) -> Callable[[BackendFn], BackendFn]:
    """Decorator registering ``fn`` as attention backend ``name`` (see the module docstring for the signature)."""

    def deco(fn: BackendFn) -> BackendFn:
        if name in _REGISTRY:
            raise ValueError(f"attention backend {name!r} is already registered")
        _REGISTRY[name] = Backend(
            name,
            fn,
            capabilities,
            priority,
            description,
            available or (lambda: None),
            check or (lambda call: None),
            boost or (lambda call: None),
        )
        return fn

    return deco


def list_backends() -> dict[str, Backend]:
    """All registered backends by name."""
    return dict(_REGISTRY)


def get_backend(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(_REGISTRY)} or 'auto'") from None


def check_backend_name(name: str) -> str:
    if name != "auto":
        get_backend(name)
    return name


def _call_info(
    q: Tensor, k: Tensor, mask: AttnMask | None, dropout_p: float, need_weights: bool, exact: bool, sinks: bool = False
) -> CallInfo:
    lq, lk = q.shape[2], k.shape[2]
    return CallInfo(
        device=q.device.type,
        dtype=q.dtype,
        need_weights=need_weights,
        mask_parts=frozenset() if mask is None else mask.parts,
        dropout_p=dropout_p,
        gqa=q.shape[1] != k.shape[1],
        exact=exact,
        pattern=None if mask is None or mask.pattern is None else mask.pattern.kind,
        square_causal=mask is not None and mask.square_causal(lq, lk),
        needs_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k)),
        sizes=(lq, lk, q.shape[3]),
        sinks=sinks,
    )


_RESOLVED: dict[
    tuple, Backend
] = {}  # (name, call, registered names) -> backend: a stack's layers make the same call in turn


def resolve(name: str, call: CallInfo) -> Backend:
    """The backend that will run ``call``: ``name`` itself, or for ``auto`` the best capable one. Answers are
    remembered per call description and set of registered backends (a decoding step's 30 layers ask once)."""
    key = (name, call, tuple(_REGISTRY))
    found = _RESOLVED.get(key)
    if found is not None and found is _REGISTRY.get(found.name):
        return found
    backend = _resolve(name, call)
    if len(_RESOLVED) > 256:
        _RESOLVED.clear()
    _RESOLVED[key] = backend
    return backend


def _resolve(name: str, call: CallInfo) -> Backend:
    if name != "auto":
        backend = get_backend(name)
        reason = backend.why_not(replace(call, exact=False))  # naming an approximate backend is a choice
        if reason:
            capable = [b.name for b in _REGISTRY.values() if b.why_not(call) is None]
            raise ValueError(f"attention backend {name!r} {reason}; use backend='auto' or one of {capable}")
        return backend
    for backend in ranked(call):
        if backend.why_not(call) is None:
            return backend
    raise RuntimeError(f"no registered attention backend can run {call}")


def ranked(call: CallInfo) -> list[Backend]:
    """Every backend in ``auto``'s order for ``call`` (highest rank first; ties keep registration order)."""
    return sorted(_REGISTRY.values(), key=lambda b: -b.rank(call)[0])


def explain(
    q: Tensor,
    k: Tensor,
    *,
    mask=None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    exact: bool = True,
    sinks: bool = False,
) -> list[tuple[str, str | None]]:
    """For each backend in ``auto``'s order: ``(name, None)`` if capable, else ``(name, reason it was skipped)``.
    The call is described as :func:`attention` takes it (``mask``, ``is_causal``, ...)."""
    call = _call_info(q, k, AttnMask.of(mask, is_causal=is_causal), dropout_p, need_weights, exact, sinks)
    return [(b.name, b.why_not(call)) for b in ranked(call)]


def explain_choice(
    q: Tensor,
    k: Tensor,
    *,
    mask=None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    exact: bool = True,
    sinks: bool = False,
) -> str:
    """``auto``'s choice for this call in words: the backend, why it ranks first, and why each backend ranked above
    it was skipped, e.g. ``"flex (rank 25: sparse patterns on cuda ...); skipped: ..."``."""
    call = _call_info(q, k, AttnMask.of(mask, is_causal=is_causal), dropout_p, need_weights, exact, sinks)
    skipped: list[str] = []
    for b in ranked(call):
        reason = b.why_not(call)
        if reason is None:
            rank, why = b.rank(call)
            text = f"auto runs {b.name!r} (rank {rank}{': ' + why if why else ''})"
            return text + (f"; skipped before it: {'; '.join(skipped)}" if skipped else "")
        skipped.append(f"{b.name} {reason}")
    return f"no backend can run this call: {'; '.join(skipped)}"


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            fix = f"torch.from_numpy({name})" if type(t).__module__ == "numpy" else f"torch.as_tensor({name})"
            raise TypeError(
                f"{name} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}; convert it with {fix}"
            )
        if not t.is_floating_point():
            raise TypeError(
                f"{name} must be floating point, got {t.dtype}; cast it with {name}.float() (attention "
                "takes float16, bfloat16, float32 or float64)"
            )
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
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v are on different devices ({q.device}, {k.device}, {v.device}); move them to one "
            "with .to(q.device)"
        )


def _prepare(q: Tensor, k: Tensor, v: Tensor, mask, is_causal: bool, scale) -> tuple[AttnMask | None, float]:
    """The one preparation step of :func:`attention` and :func:`attention_weights`: shapes checked, the mask made
    structured and validated once, the scale resolved."""
    _check_qkv(q, k, v)
    b, h, lq, d = q.shape
    am = AttnMask.of(mask, is_causal=is_causal)
    if am is not None:
        am = am.check(b, h, lq, k.shape[2], q.device, q.dtype)
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite number, got {scale}; omit it for 1 / sqrt(D)")
    return am, (1.0 / math.sqrt(d) if scale is None else float(scale))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask=None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
    backend: str = "auto",
    weights_hook: Callable[[Tensor], Tensor] | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``, over registered backends.

    Args:
        q: ``(B, H, Lq, D)`` queries.
        k: ``(B, Hkv, Lk, D)`` keys; ``H % Hkv == 0`` (``Hkv < H``: grouped-query / multi-query attention).
        v: ``(B, Hkv, Lk, Dv)`` values.
        mask: an :class:`~multihead.attention.attn_mask.AttnMask` (key padding, causal with an offset, a sparse
            pattern, a dense part), or its parts as callers have them: a bool (True = may attend) or float (added to
            the scores) tensor broadcastable to ``(B, H, Lq, Lk)``, or a
            :class:`~multihead.attention.patterns.SparsePattern` (self-attention): sparse backends run patterns
            without building ``Lq x Lk``, every other backend gets their dense form.
        is_causal: forbid keys after each query, aligned to the bottom right when ``Lq != Lk``
            (see :func:`multihead.masks.causal_mask`). Combined with ``mask`` when both are given.
        dropout_p: dropout on the attention weights (pass 0 in eval).
        scale: score scale, default ``1 / sqrt(D)``.
        need_weights: also return the per-head weights ``(B, H, Lq, Lk)`` (before dropout).
        backend: a registered backend name, or ``"auto"``.
        weights_hook: ``fn(weights) -> weights``: the weights ``(B, H, Lq, Lk)`` are computed explicitly (the
            reference formula), passed through ``fn`` (which may read or edit them; a module's ``hook_pattern``),
            then dropout and the values are applied here -- the one place the hooked path lives.
        sinks: ``(H,)`` learned sink logits (as gpt-oss): each head's logit joins every row's softmax denominator,
            ``p_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij))``, so the weights sum to less than 1. A backend
            declaring ``Capabilities.sinks`` takes them; any other runs them as one extra key (exact). Not with
            sparse patterns on a sparse kernel (``auto`` then takes a dense one).

    Returns:
        ``(out, weights)``: ``out`` is ``(B, H, Lq, Dv)``; ``weights`` is None unless ``need_weights``.
        Query rows with no allowed key give zeros in both.
    """
    from .ops import expand_kv, open_empty_rows, probabilities, with_sink_key, zero_rows

    am, scale = _prepare(q, k, v, mask, is_causal, scale)
    _check_sinks(sinks, q)
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if lq == 0 or lk == 0:  # nothing to attend (or no query): zeros, as for fully masked rows, on every backend
        out = (q[..., :1] * 0).expand(b, h, lq, v.shape[-1]) + v.sum() * 0  # keeps q and v in the graph
        return out, (q.new_zeros(b, h, lq, lk) if need_weights else None)

    if weights_hook is not None:  # explicit weights, edited by the hook; rows with no key are zero in them
        weights = weights_hook(probabilities(q, k, am, scale, sinks))  # (b, h, i, j)
        dropped = torch.nn.functional.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        return torch.matmul(dropped, expand_kv(v, h)), (weights if need_weights else None)  # (b, h, i, d)

    chosen = resolve(backend, _call_info(q, k, am, dropout_p, need_weights, exact=True, sinks=sinks is not None))
    nan_q = None if chosen.capabilities.nan_rows else torch.isnan(q).any(-1, keepdim=True)  # (b, h, i, 1)
    extra = {}
    if sinks is not None and chosen.capabilities.sinks:
        extra = {"sinks": sinks}
    elif sinks is not None:  # one extra key that scores sink_h, value 0; its column dropped from the weights
        q, k, v, am = with_sink_key(q, k, v, am, sinks, scale)
        lk += 1
    row_ok = None
    if am is not None:
        c = chosen.capabilities
        am = am.for_backend(c.mask_parts + c.patterns, lq, lk, q.device)  # the rest densified, once
        if am is not None and am.tensor is not None:
            tensor, row_ok = open_empty_rows(am.tensor)
            am = replace(am, tensor=tensor) if row_ok is not None else am
    out, kept = chosen.fn(q, k, v, mask=am, dropout_p=dropout_p, scale=scale, need_weights=need_weights, **extra)
    if nan_q is not None:  # e.g. SDPA's CPU kernels turn a NaN query row into zeros: NaN, as on every other backend
        out = out.masked_fill(nan_q, math.nan)
    out = zero_rows(out, row_ok)
    if not need_weights or kept is None:
        return out, None
    weights = zero_rows(kept, row_ok)
    return out, (weights[..., 1:] if sinks is not None and not extra else weights)


def _check_sinks(sinks: Tensor | None, q: Tensor) -> None:
    if sinks is None:
        return
    if not isinstance(sinks, Tensor) or sinks.shape != (q.shape[1],) or not sinks.is_floating_point():
        got = tuple(sinks.shape) if isinstance(sinks, Tensor) else type(sinks).__name__
        raise ValueError(f"sinks must be a float tensor of one logit per query head, ({q.shape[1]},); got {got}")
    if sinks.device != q.device:
        raise ValueError(f"sinks are on {sinks.device} but q is on {q.device}; move them with .to(q.device)")


def attention_weights(
    q: Tensor, k: Tensor, *, mask=None, is_causal: bool = False, scale: float | None = None, sinks: Tensor | None = None
) -> Tensor:
    """Per-head weights ``softmax(q k^T * scale + mask)`` ``(B, H, Lq, Lk)``, fully masked rows zero: the same
    preparation as :func:`attention` (one validation), then the reference formula (``sinks`` as there)."""
    from .ops import probabilities

    am, scale = _prepare(q, k, k, mask, is_causal, scale)
    _check_sinks(sinks, q)
    return probabilities(q, k, am, scale, sinks)
