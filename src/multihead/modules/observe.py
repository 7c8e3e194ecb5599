"""Attention found by observation: any PyTorch model whose layers call ``F.scaled_dot_product_attention`` (timm's
and torchvision's vision transformers, ``nn.TransformerEncoder``, ``nn.MultiheadAttention``, HF models in their
``sdpa`` mode, a user's own module) or compute ``softmax(q k^T ...) v`` by hand (HF's eager attention, GPT-2, BLOOM,
GPT-Neo, XLNet, nanoGPT) gets multihead's hook points on every attention call, without per-model glue.

::

    observe(model, example)                   # one probe pass under a function mode finds every attention call
    with capture(model, ("pattern", "z")) as cache:
        model(x)                              # exact per-head probabilities and outputs before the merge
    cache.pattern(0)                          # (B, H, Lq, Lk)

:func:`observe` runs the model once on ``example`` under a :class:`torch.overrides.TorchFunctionMode` that sees
every call and the innermost module running it (its owner, which receives the hook points ``hook_q``, ``hook_k``,
``hook_v``, ``hook_pattern``, ``hook_z``, ``hook_stats``). An attention call is

* a fused one: ``scaled_dot_product_attention``, or ``F.multi_head_attention_forward``;
* or one written by hand, told by dataflow, not by names: a product of two tensors (``matmul``, ``@``, ``bmm``,
  ``baddbmm``, ``einsum``) makes scores; elementwise ops, views and casts keep them scores (scale, mask, ALiBi); a
  softmax over their last dimension makes weights (dropout and casts keep them weights); a product of weights
  with values makes the heads' outputs. A softmax of scores that never meets values (a router) is not a site. The
  weights must be ``(B, H, Lq, Lk)`` where the heads are told apart; a softmax over ``(B*H, Lq, Lk)`` is refused.

Afterwards a forward of the model enters the mode only while one of those hook points is in use: with nothing
captured the model runs exactly as before (its own kernels, its fused fast paths). Inside the mode the k-th
attention call of a forward is the k-th call of the probe, checked against its kind, head count and head size (a
model that calls attention otherwise than in the probe is refused, by name; key/value heads handed to SDPA grouped on
one call and repeated to the query heads on another, as transformers 4.x does with and without a mask, are the same
call, hooked with the heads the probe saw). A hooked fused call is computed on
multihead's kernel seam from the call's own queries, keys, values, mask, scale and causal flag: ``softmax(q k^T *
scale + mask) v``, the weights explicit where asked for. A call written by hand keeps its own arithmetic:
``hook_pattern`` sees (and may change) its weights, ``hook_v`` its values and ``hook_z`` its heads' outputs, each as
``(B, H, L, D)``; ``hook_q`` and ``hook_k`` read the operands of its scores but may not change them (its scale and
mask come between), and ``hook_stats`` is not served there.

What the observer does not see: the output projection after the merge, except ``nn.MultiheadAttention``'s (so what
one head writes into the residual stream is not split off elsewhere: ``Site.splits_per_head`` is False).
"""

from __future__ import annotations

import inspect
import math
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..attention import attention
from ..attention.attn_mask import AttnMask
from ..attention.ops import expand_kv
from .anatomy import Anatomy, blocks_of, register_source, token_embedding
from .hooks import HookPoint
from .by_hand import BY_HAND, ObserveError, _EINSUM, _Flow, _PRODUCTS, _SOFTMAX, _values, _weights, weights_first

HOOKS = ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_stats")
_SDPA = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_MHA = F.multi_head_attention_forward


def _kind(func) -> str:
    return "nn.MultiheadAttention" if func is _MHA else "attention by hand" if func is BY_HAND else "fused attention"


_MHA_SIGNATURE = inspect.signature(_MHA)


def _mha_arguments(args, kwargs) -> dict:
    bound = _MHA_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _mha_shapes(a: dict) -> tuple[torch.Size, torch.Size]:
    """The per-head query and key shapes ``(B, H, L, D)`` of an ``F.multi_head_attention_forward`` call."""
    q, k, h = a["query"], a["key"], int(a["num_heads"])
    b = q.shape[1] if q.dim() == 3 else 1
    d = int(a["embed_dim_to_check"]) // h
    return torch.Size([b, h, q.shape[0], d]), torch.Size([b, h, k.shape[0], d])


class ObservedAttention:
    """One observed attention site: its owner module and name, the heads, key/value heads and head size of the
    probe's call, and the hook points (children of the owner)."""

    hook_q: HookPoint
    hook_k: HookPoint
    hook_v: HookPoint
    hook_pattern: HookPoint
    hook_z: HookPoint
    hook_stats: HookPoint

    def __init__(self, name: str, module: nn.Module, func, q_shape: torch.Size, k_shape: torch.Size) -> None:
        self.name, self._module, self.func = name, module, func
        self.num_heads, self.num_kv_heads, self.head_dim = int(q_shape[-3]), int(k_shape[-3]), int(q_shape[-1])
        self.probe_lengths = (int(q_shape[-2]), int(k_shape[-2]))  # queries and keys in the probe pass
        self.flat = False  # written by hand on (batch * heads, L, D) tensors (set by observe)
        self.stats_options: dict = {}
        # ``F.multi_head_attention_forward`` merges the heads and projects them itself: its output projection is
        # known (nn.MultiheadAttention's out_proj). A bare attention call's merge and projection happen elsewhere.
        out = getattr(module, "out_proj", None) if func is _MHA else None
        self.w_o = out if isinstance(out, nn.Linear) else None
        self.z_feeds_output: bool | None = self.w_o is not None
        for hook in HOOKS:
            setattr(self, hook, getattr(module, hook))

    @property
    def active(self) -> bool:
        return any(getattr(self, h).active for h in HOOKS)


@dataclass
class Observed:
    """What :func:`observe` found and installed on a model (to undo it with :func:`unobserve`)."""

    model: nn.Module
    sites: list[ObservedAttention]
    handles: list = field(default_factory=list)
    added: list[tuple[nn.Module, str]] = field(default_factory=list)
    # every attention call of the probe in order: its kind, and its site (None: a softmax of scores that met no
    # values, so not attention, which a forward must still make in the same place)
    calls: list[tuple[object, ObservedAttention | None]] = field(default_factory=list)
    # the anatomy source that describes this model instead of the observer's own (e.g. "hf": an HF model attached
    # by observation, whose blocks, norms and unembedding HF's structure gives); None: the observer's
    described_by: str | None = None
    # the names of the modules that ran in the probe pass (a module that did not cannot be told from one without
    # attention)
    ran: set[str] = field(default_factory=set)
    # the names of the modules that called a softmax in the probe pass (the innermost module running at the call)
    softmaxed: set[str] = field(default_factory=set)


_OBSERVED: weakref.WeakKeyDictionary[nn.Module, Observed] = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class _Event:
    """One attention call of the probe, in call order: a fused call (``func`` is SDPA's or
    ``F.multi_head_attention_forward``), or a softmax over scores made by a product (``func`` is :data:`BY_HAND`;
    ``site`` turns True when its weights multiply the values, which makes it attention)."""

    owner: nn.Module | None
    func: object
    q_shape: torch.Size | None = None
    k_shape: torch.Size | None = None
    weights_shape: torch.Size | None = None
    site: bool = True
    flat: bool = False  # the weights are (batch * heads, Lq, Lk)
    products: int = 0  # how many products of its weights with values (more than one: the values in parts)
    mangled: bool = False  # its weights, cut, padded or joined with others, multiply something
    behind: bool = False  # its weights multiply the values from the right (values @ weights^T)


class _Probe(TorchFunctionMode):
    """Records each attention call (:class:`_Event`), its owner (the innermost running module) and its queries' and
    keys' shapes."""

    def __init__(self, stack: list[nn.Module], batch: int | None = None) -> None:
        super().__init__()
        self.stack, self.batch = stack, batch
        self.softmaxed: set[int] = set()
        self.softmaxes: dict[int, int] = {}  # softmax calls per innermost module
        self.events: list[_Event] = []
        self.mixed: list[nn.Module] = []  # modules multiplying by weights made from mixed scores (talking heads)
        self.flow = _Flow()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.stack[-1] if self.stack else None
        if func in _SDPA:
            self.events.append(_Event(owner, func, args[0].shape, args[1].shape))
            return func(*args, **kwargs)
        if func is _MHA:  # nn.MultiheadAttention's function (the calls inside it are not seen)
            self.events.append(_Event(owner, func, *_mha_shapes(_mha_arguments(args, kwargs))))
            return func(*args, **kwargs)
        if func in _SOFTMAX and owner is not None:
            self.softmaxed.add(id(owner))
            made = self.flow.tags.get(args[0]) if args and isinstance(args[0], Tensor) else None
            if made is None or made[0] != "projected":  # a projection's softmax is a gate or a kernel, not attention
                self.softmaxes[id(owner)] = self.softmaxes.get(id(owner), 0) + 1
        scores = self.flow.softmax_of_scores(func, args, kwargs)
        mixed = self.flow.softmax_of_mixed(func, args, kwargs)
        out = func(*args, **kwargs)
        if mixed:
            self.flow.tags[out] = ("mixed-weights",)
            return out
        if scores is not None:
            event = _Event(owner, BY_HAND, weights_shape=out.shape, site=False)
            self.events.append(event)
            self.flow.tags[out] = ("weights", event, out.shape)
            return out
        if func in _PRODUCTS or func is _EINSUM:
            if owner is not None and self.flow.mixed_in(args, kwargs):
                self.mixed.append(owner)
            part = self.flow.part_in(args, kwargs)
            if part is not None:  # values times weights cut, padded or joined: banded, chunked or local attention
                part.mangled = True
            weights, tag = self.flow.weights_in(args, kwargs)
            if weights is not None:  # weights times values: attention, written by hand
                event = tag[1]
                if not event.site and owner is not None:  # the module multiplying by the values owns the site (the
                    event.owner = owner  # softmax may run in a child: CPM-Ant's nn.Softmax)
                shape = event.weights_shape
                if not event.site and len(shape) == 3 and self.batch and shape[0] % self.batch == 0:
                    # (batch * heads, Lq, Lk): the heads flattened into the batch, batch-major as a view of
                    # (batch, heads, ...) makes them; told apart only where the example's batch size is known
                    shape = event.weights_shape = torch.Size([self.batch, shape[0] // self.batch, *shape[1:]])
                    event.flat = True
                if not event.site and len(shape) == 4:
                    b, h, lq, lk = shape
                    d = out.numel() // max(1, b * h * lq)
                    event.q_shape, event.k_shape = torch.Size([b, h, lq, d]), torch.Size([b, h, lk, d])
                event.site = True
                event.products += 1
                event.behind = event.behind or not weights_first(func, args, kwargs, weights)
                return out
        self.flow.follow(func, args, kwargs, out)
        return out


class _Serve(TorchFunctionMode):
    """During a forward with a hook point in use: the k-th attention call runs as the probe's k-th call did, through
    its site's hook points."""

    def __init__(self, observed: Observed) -> None:
        super().__init__()
        self.observed, self.count = observed, 0
        self.flow = _Flow()

    def _next(self, func) -> ObservedAttention | None:
        calls = self.observed.calls
        if self.count >= len(calls):
            raise ObserveError(
                f"{type(self.observed.model).__name__} called attention {self.count + 1} times in one forward, where "
                f"the probe pass saw {len(calls)}: it calls attention otherwise than when it was observed; observe it "
                "again on an input like this one (multihead.modules.observe.observe(model, example))"
            )
        kind, site = calls[self.count]
        self.count += 1
        if _kind(kind) != _kind(func):
            raise ObserveError(
                f"{site.name if site else type(self.observed.model).__name__}: the model's attention calls came in "
                f"another order than in the probe pass ({_kind(func)} where it made {_kind(kind)}); observe it again "
                "on an input like this one"
            )
        return site

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _MHA:
            return _mha(self._next(func), func, args, kwargs)
        if func in _SDPA:
            return _attend(self._next(func), func, *args, **kwargs)
        scores = self.flow.softmax_of_scores(func, args, kwargs)
        if scores is not None:
            site = self._next(BY_HAND)
            out = func(*args, **kwargs)
            if site is None:
                return out
            out = _weights(site, out, scores)
            h = site.num_heads
            self.flow.tags[out] = (
                "weights",
                site,
                torch.Size([out.shape[0] // h, h, *out.shape[1:]]) if site.flat else out.shape,
            )
            return out
        if func in _PRODUCTS or func is _EINSUM:
            weights, tag = self.flow.weights_in(args, kwargs)
            if weights is not None:
                return _values(tag[1], tag[2], weights, func, args, kwargs)
        out = func(*args, **kwargs)
        self.flow.follow(func, args, kwargs, out)
        return out


def _attend(site: ObservedAttention, func, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """One attention call through ``site``'s hook points (the call's own function where none is in use)."""
    if not site.active:
        return func(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
    if q.dim() != 4 or k.dim() != 4:
        raise ObserveError(
            f"{site.name} calls attention on {q.dim()}-D queries; the observer splits (batch, heads, length, size) "
            "tensors into heads only"
        )
    mask = None
    if is_causal:  # SDPA's causal mask is aligned to the top left
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        mask = attn_mask if mask is None else _combine(mask, attn_mask)
    return _through(site, q, k, v, mask, float(dropout_p), scale)[0]


def _as_probed(site: ObservedAttention, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``k`` and ``v`` with as many key/value heads as the probe pass saw. A grouped-query model may hand its
    key/value heads to SDPA grouped (``enable_gqa``) on one call and repeated to the query heads on another
    (transformers 4.x does, as a mask is given or not): the same attention, in two shapes. Grouped heads are repeated
    as SDPA groups them (query head ``i`` reads key/value head ``i // group``); repeated heads are taken back to one
    per group only where they are copies. Anything else is left for the caller to refuse."""
    h, n, probed = q.shape[1], k.shape[1], site.num_kv_heads
    if n == probed or h != site.num_heads or n != v.shape[1]:
        return k, v
    if probed == h and h % n == 0:  # grouped here, repeated in the probe
        return expand_kv(k, h), expand_kv(v, h)
    if n == h and h % probed == 0:  # repeated here, grouped in the probe
        kk, vv = k[:, :: h // probed], v[:, :: h // probed]
        if torch.equal(expand_kv(kk, h), k) and torch.equal(expand_kv(vv, h), v):
            return kk, vv
    return k, v


def _through(site: ObservedAttention, q, k, v, mask, dropout_p: float, scale, need_weights: bool = False):
    """``(z, weights)`` of one call through ``site``'s hook points, on the kernel seam: ``mask`` bool (True = may
    attend) or float (added to the scores)."""
    k, v = _as_probed(site, q, k, v)
    if (q.shape[1], k.shape[1], q.shape[-1]) != (site.num_heads, site.num_kv_heads, site.head_dim):
        raise ObserveError(
            f"{site.name} attends {q.shape[1]} heads ({k.shape[1]} key/value heads) of size {q.shape[-1]}, where the "
            f"probe pass saw {site.num_heads} ({site.num_kv_heads}) of size {site.head_dim}: the model changed shape "
            "since it was observed; observe it again"
        )
    q, k, v = site.hook_q(q), site.hook_k(k), site.hook_v(v)
    am = AttnMask.of(mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if site.hook_stats.active:
        from ..attention.stats import attention_stats

        site.hook_stats(attention_stats(q, k, mask=am, scale=scale, **site.stats_options))
    pattern = site.hook_pattern if site.hook_pattern.active else None
    z, w = attention(
        q, k, v, mask=am, scale=scale, dropout_p=dropout_p, weights_hook=pattern, need_weights=need_weights
    )
    return site.hook_z(z), w


def _mha(site: ObservedAttention, func, args, kwargs):
    """``F.multi_head_attention_forward`` through ``site``'s hook points (its own code where none is in use): the
    projections, the heads attended on the kernel seam, merged and projected as PyTorch does."""
    if not site.active:
        return func(*args, **kwargs)
    a = _mha_arguments(args, kwargs)
    for name in ("bias_k", "bias_v", "static_k", "static_v"):
        if a[name] is not None:
            raise ObserveError(f"{site.name} passes {name}; the observer serves nn.MultiheadAttention without it")
    if a["add_zero_attn"]:
        raise ObserveError(f"{site.name} uses add_zero_attn; the observer serves nn.MultiheadAttention without it")
    query, key, value = a["query"], a["key"], a["value"]
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    lq, b, e = query.shape
    lk, h = key.shape[0], int(a["num_heads"])
    d = e // h
    if a["use_separate_proj_weight"]:
        ws = (a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"])
    else:
        ws = a["in_proj_weight"].chunk(3)
    bs = a["in_proj_bias"].chunk(3) if a["in_proj_bias"] is not None else (None, None, None)
    q = F.linear(query, ws[0], bs[0]).view(lq, b, h, d).permute(1, 2, 0, 3)  # (B, H, Lq, D)
    k = F.linear(key, ws[1], bs[1]).view(lk, b, h, d).permute(1, 2, 0, 3)  # (B, H, Lk, D)
    v = F.linear(value, ws[2], bs[2]).view(lk, b, h, d).permute(1, 2, 0, 3)
    mask = None  # PyTorch's masks: bool True = may NOT attend; float added
    attn_mask, padding = a["attn_mask"], a["key_padding_mask"]
    if attn_mask is None and a["is_causal"]:
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
    elif attn_mask is not None:
        m = attn_mask.view(b, h, lq, lk) if attn_mask.dim() == 3 else attn_mask
        mask = ~m if m.dtype == torch.bool else m
    if padding is not None:
        p = padding[:, None, None, :]
        p = ~p if p.dtype == torch.bool else p
        mask = p if mask is None else _combine(mask, p)
    dropout = float(a["dropout_p"]) if a["training"] else 0.0
    z, w = _through(site, q, k, v, mask, dropout, None, need_weights=bool(a["need_weights"]))
    out = F.linear(z.permute(2, 0, 1, 3).reshape(lq, b, e), a["out_proj_weight"], a["out_proj_bias"])
    if w is not None and a["average_attn_weights"]:
        w = w.mean(1)
    if unbatched:
        out = out.squeeze(1)
        w = None if w is None else w.squeeze(0)
    return out, w


def _combine(a: Tensor, b: Tensor) -> Tensor:
    """Two masks as one (bool: both allow; float: added, a bool one as 0 / -inf)."""
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    as_float = [
        m if m.dtype != torch.bool else torch.zeros(m.shape, device=m.device).masked_fill(~m, -math.inf) for m in (a, b)
    ]
    return as_float[0] + as_float[1]


def observe(model: nn.Module, *args, example_batch: int | None = None, **kwargs) -> Observed:
    """Find every attention call of ``model`` in one forward pass on ``args``/``kwargs`` (an example input), give
    each call's owner module the hook points, and serve them from then on (module docstring). ``example_batch``:
    the example's batch size, where known; it lets the observer split attention written by hand on ``(batch *
    heads, L, D)`` tensors into heads (else such a call is refused by name). Refuses a model in which no attention
    call was seen, and one already observed."""
    if model in _OBSERVED:
        raise ObserveError(f"{type(model).__name__} is observed already; call unobserve(model) first")
    if example_batch is not None and (
        isinstance(example_batch, bool) or not isinstance(example_batch, int) or example_batch < 1
    ):
        raise ObserveError(
            f"example_batch must be the example's batch size, a whole number >= 1; got {example_batch!r}"
        )
    named = {id(m): n for n, m in model.named_modules()}
    stack: list[nn.Module] = []
    handles = []

    ran: set[int] = set()

    def push(mod, a) -> None:
        stack.append(mod)
        ran.add(id(mod))

    def pop(mod, a, out) -> None:
        stack.pop()

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(push))
        handles.append(m.register_forward_hook(pop, always_call=True))
    probe = _Probe(stack, example_batch)
    was = model.training
    try:
        model.eval()
        with torch.no_grad(), probe:
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    for event in probe.events:
        if event.func is BY_HAND and event.mangled and event.owner is not None:
            label = named.get(id(event.owner)) or type(event.owner).__name__
            raise ObserveError(
                f"{label} multiplies values by its attention weights cut, padded or joined with others (banded, "
                "chunked or local attention), or mixed with another tensor of their size (gated positional "
                "attention): the observer serves one product of whole (batch, heads, queries, keys) weights, as the "
                "softmax made them, with the values"
            )
    for event in probe.events:
        if event.behind and event.owner is not None:
            label = named.get(id(event.owner)) or type(event.owner).__name__
            raise ObserveError(
                f"{label} multiplies its values by its weights from the left (values @ weights^T); the observer "
                "serves weights @ values"
            )
    for mixer in probe.mixed[:1]:
        label = named.get(id(mixer)) or type(mixer).__name__
        raise ObserveError(
            f"{label} mixes its attention scores through a learned projection before the softmax and multiplies the "
            "values by the result (talking-heads attention): no one head's pattern is what reaches the values, so "
            "the observer cannot tell its heads apart"
        )
    if not any(e.site for e in probe.events):
        raise ObserveError(
            f"no attention call was seen in one forward pass of {type(model).__name__}: it calls no "
            "scaled_dot_product_attention, no nn.MultiheadAttention and no softmax of a product that then multiplies "
            "values (a model without softmax attention)"
        )
    observed = Observed(
        model,
        [],
        ran={n for n, m in model.named_modules() if id(m) in ran},
        softmaxed={n for n, m in model.named_modules() if id(m) in probe.softmaxed},
    )
    owners: dict[int, int] = {}
    try:
        for event in probe.events:
            if not event.site:
                observed.calls.append((event.func, None))
                continue
            owner = event.owner
            assert owner is not None  # a call is made inside the model, which the probe's stack holds
            name = named.get(id(owner), type(owner).__name__)
            label = name or type(owner).__name__
            n = owners.get(id(owner), 0)
            owners[id(owner)] = n + 1
            if n > 0:
                raise ObserveError(
                    f"{label} calls attention {n + 1} times in one forward; the observer gives each module one "
                    "attention site"
                )
            told = sum(e.func is BY_HAND and e.owner is owner for e in probe.events)
            if event.func is BY_HAND and probe.softmaxes.get(id(owner), 0) > told:
                raise ObserveError(
                    f"{label} calls softmax {probe.softmaxes[id(owner)]} times in one forward, and the observer told "
                    f"{told} of them apart as softmax(q k^T) v: the others (attention over scores it could not follow, "
                    "e.g. built by concatenation or padding) would be missed"
                )
            if event.products > 1:
                raise ObserveError(
                    f"{label} multiplies its attention weights with values in {event.products} parts (slices of the "
                    "weights): the observer serves one product of the weights with the values"
                )
            if event.q_shape is None or event.k_shape is None:
                shape = tuple(event.weights_shape or ())
                raise ObserveError(
                    f"{label} computes attention by hand over {len(shape)}-D scores "
                    f"{shape}: the observer cannot tell its heads apart (it splits (batch, heads, "
                    "queries, keys) weights, and (batch * heads, queries, keys) where observe is told the example's "
                    "batch size: example_batch=...)"
                )
            if len(event.q_shape) != 4 or len(event.k_shape) != 4:
                raise ObserveError(
                    f"{label} calls attention on {len(event.q_shape)}-D queries; the observer splits (batch, heads, "
                    "length, size) tensors into heads only"
                )
            for hook in HOOKS:
                if hook in owner._modules or hasattr(owner, hook):
                    raise ObserveError(f"{label} already has an attribute {hook!r}; multihead will not overwrite it")
                owner.add_module(hook, HookPoint())
                observed.added.append((owner, hook))
            site = ObservedAttention(name, owner, event.func, event.q_shape, event.k_shape)
            site.flat = event.flat
            observed.sites.append(site)
            observed.calls.append((event.func, site))
    except BaseException:
        _undo(observed)
        raise

    state: dict[str, _Serve] = {}

    def enter(mod, a):
        if any(site.active for site in observed.sites):
            state["mode"] = _Serve(observed)
            state["mode"].__enter__()

    def leave(mod, a, out):
        mode = state.pop("mode", None)
        if mode is not None:
            mode.__exit__(None, None, None)

    observed.handles.append(model.register_forward_pre_hook(enter))
    observed.handles.append(model.register_forward_hook(leave, always_call=True))
    _OBSERVED[model] = observed
    return observed


def _undo(observed: Observed) -> None:
    for h in observed.handles:
        h.remove()
    for owner, hook in observed.added:
        owner._modules.pop(hook, None)
    observed.handles.clear()
    observed.added.clear()


def unobserve(model: nn.Module) -> nn.Module:
    """Undo :func:`observe`: every hook point and hook removed. Returns the model."""
    observed = _OBSERVED.pop(model, None)
    if observed is None:
        raise ObserveError(f"{type(model).__name__} is not observed")
    _undo(observed)
    return model


def _anatomy(model: nn.Module) -> Anatomy | None:
    """The anatomy source of observed models: the attention sites in call order (no blocks: the observer does not
    know where the residual stream runs)."""
    observed = _OBSERVED.get(model)
    if observed is None or observed.described_by is not None:
        return None
    sites, blocks = blocks_of(model, [(s.name, s) for s in observed.sites], lambda block: None)
    return Anatomy("observed", model, tuple(sites), tuple(blocks), token_embedding(model), None, None)


register_source("observed", _anatomy)

__all__ = ["BY_HAND", "HOOKS", "ObserveError", "Observed", "ObservedAttention", "observe", "unobserve"]
