"""KV cache policies: which cached keys each key/value head keeps while a causal LM decodes.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads (of one group), ``N`` kept positions, ``Q`` query
positions of a call, ``D`` head dim.

A :class:`KVPolicy` splits every layer's key/value heads into groups and gives each group a :class:`Rule`:

* ``full`` -- every key (the plain :class:`~multihead.modules.kv_cache.LayerKV`, bit-identical to it);
* ``window`` -- the first ``sinks`` keys plus the most recent ones, at their original positions (StreamingLLM,
  Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks");
* ``h2o`` -- the most recent half plus the keys with the largest attention received so far, summed over every
  query that read them (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle");
* ``snapkv`` -- once, after the prompt: the keys that the prompt's last 32 queries attend to most, pooled over 7
  neighbours, plus those 32 (Li et al. 2024, "SnapKV"); generated keys are all kept, as in the paper;
* ``head-aware`` -- every key for the retrieval heads, sinks + window for the others (DuoAttention, Xiao et al.
  2024; RazorAttention, Tang et al. 2024): the split is read from :func:`multihead.interpret.kv_heads.classify`.

A call attends with every key it brings (a prompt is read whole, as every paper above does), then the cache is cut
to the budget: the evicted keys' memory is released (the buffers are rebuilt at the budget's size). Under grouped-
query attention a key/value head is shared by its query heads: scores are summed over the group, and the decision
is per shared head. Sliding-window layers (Gemma 3, Mistral) keep only their window under every policy, ``full``
included: the keys past it can never be read again.

A new policy is a function ``(budget, **options) -> KVPolicy`` in :data:`KV_POLICIES`; a new rule subclasses
:class:`Rule` (its :meth:`Rule.keep`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .kv_cache import KVView, LayerKV

OBSERVE_CHUNK = 256  # query rows per block when the received attention is summed (bounded memory at long prompts)


# ---------------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    """What one group of key/value heads keeps. Subclasses say which scores they need (:attr:`scores`) and which
    slots to keep (:meth:`keep`); slots are always in position order."""

    scores = ""  # "": none; "received": attention received from every query; "observed": the prompt's last queries

    def observed(self) -> int | None:
        """With ``scores == "observed"``: how many of the prompt's last queries are summed (None: every query)."""
        return None

    def smooth(self, score: Tensor) -> Tensor:
        """The summed attention ``(B, H, N)`` per query head as the rule ranks it (SnapKV pools it)."""
        return score

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        """Slots to keep ``(B, G, M)`` (ascending) out of ``pos`` ``(B, G, N)``, or None to keep all. ``prompt``:
        this is the first call (the prompt)."""
        raise NotImplementedError

    @property
    def budget(self) -> int | None:
        """Keys kept per head after each call (None: no bound)."""
        return None


@dataclass(frozen=True)
class Full(Rule):
    """Every key."""

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        return None


def _arange(n: int, like: Tensor, start: int = 0) -> Tensor:
    return torch.arange(start, start + n, device=like.device).expand(*like.shape[:-1], n)


@dataclass(frozen=True)
class SinksWindow(Rule):
    """The first ``sinks`` keys and the ``window`` most recent ones (``sinks=0``: a plain sliding window)."""

    sinks: int = 4
    window: int = 60

    def __post_init__(self) -> None:
        if self.sinks < 0 or self.window < 1:
            raise ValueError(
                f"a sinks + window rule needs sinks >= 0 and window >= 1, got sinks={self.sinks}, "
                f"window={self.window}: a budget must leave at least one recent key after the sinks"
            )

    @property
    def budget(self) -> int:
        return self.sinks + self.window

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        n = pos.shape[-1]
        if n <= self.budget:
            return None
        return torch.cat([_arange(self.sinks, pos), _arange(self.window, pos, n - self.window)], -1)


def _heavy_and_recent(score: Tensor, heavy: int, recent: int) -> Tensor:
    """Slots ``(B, G, heavy + recent)``: the ``recent`` last ones and, among the others, the ``heavy`` with the
    largest ``score``, all in position order."""
    n = score.shape[-1]
    older = score[..., : n - recent]  # (B, G, N - recent)
    top = older.topk(heavy, dim=-1).indices.sort(-1).values  # (B, G, heavy), ascending slots
    return torch.cat([top, _arange(recent, score, n - recent)], -1)


@dataclass(frozen=True)
class HeavyHitters(Rule):
    """H2O: the ``recent`` most recent keys and the ``heavy`` others with the largest accumulated attention (the sum
    of every weight they received, from every query of every call since they entered)."""

    heavy: int = 32
    recent: int = 32
    scores = "received"

    def __post_init__(self) -> None:
        if self.heavy < 0 or self.recent < 1:
            raise ValueError(f"H2O needs heavy >= 0 and recent >= 1, got heavy={self.heavy}, recent={self.recent}")

    @property
    def budget(self) -> int:
        return self.heavy + self.recent

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        if pos.shape[-1] <= self.budget:
            return None
        if score is None:
            raise ValueError("H2O keeps the keys with the largest accumulated attention: no score was recorded")
        return _heavy_and_recent(score, self.heavy, self.recent)


@dataclass(frozen=True)
class SnapKV(Rule):
    """SnapKV: after the prompt, the ``budget - window`` earlier keys that the prompt's last ``window`` queries
    attend to most (their weights summed over those queries, then average-pooled over ``kernel`` neighbouring
    keys), plus the last ``window`` keys. Generated keys are all kept."""

    size: int = 64
    window: int = 32
    kernel: int = 7
    scores = "observed"

    def __post_init__(self) -> None:
        for what, v in (("budget", self.size), ("window", self.window), ("kernel", self.kernel)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"SnapKV's {what} is a whole number of keys, got {v!r}")
        if self.size < 1 or self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"SnapKV needs a budget >= 1 and an odd pooling kernel, got {self.size}, {self.kernel}")
        if self.window < 1:
            raise ValueError(
                f"SnapKV's observation window is the number of the prompt's last queries it reads: at least 1, got "
                f"window={self.window} (the paper uses 32)"
            )

    def observed(self) -> int:
        return self.window

    def smooth(self, score: Tensor) -> Tensor:
        return _pool(score, self.kernel, self.window)

    @property
    def budget(self) -> int:
        return self.size

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        n = pos.shape[-1]
        if not prompt or n <= self.size:
            return None
        if score is None:
            raise ValueError("SnapKV selects by the prompt's last queries: no observation score was recorded")
        window = min(self.window, self.size)
        return _heavy_and_recent(score, self.size - window, window)


# ---------------------------------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class KVPolicy:
    """A named split of each layer's key/value heads into groups with a :class:`Rule` each.

    ``layer_rules(layer) -> [(kv heads, rule), ...]`` (None: one group of every head under ``rule``)."""

    name: str
    rule: Rule = field(default_factory=Full)
    layer_rules: Callable[[int, int], list[tuple[list[int], Rule]]] | None = None
    layers: int | None = None  # the layers a per-layer split was made for (None: any model)

    def compress(self, cache):
        """What this policy keeps of the recorded ``cache``'s prompt, as a new cache (:func:`compress`)."""
        return compress(cache, self)

    def check_layers(self, num_layers: int) -> None:
        """Refuse a per-layer split made for a model with another number of layers."""
        if self.layers is not None and self.layers != num_layers:
            raise ValueError(
                f"the {self.name} policy's split names {self.layers} layers; this model has {num_layers}: "
                "it was made for another model: classify the heads of this model (multihead heads MODEL --kv)"
            )

    def check(self, num_kv_heads: Sequence[int]) -> None:
        """Refuse, before any work, a policy made for another model: a per-layer split must name this model's layers
        (``num_kv_heads``: the key/value heads of each layer) and heads."""
        self.check_layers(len(num_kv_heads))
        for i, g in enumerate(num_kv_heads):
            self.rules(i, g)

    def rules(self, layer: int, num_kv_heads: int) -> list[tuple[list[int], Rule]]:
        """The groups of ``layer``: ``[(key/value head indices, rule), ...]``; every head in exactly one group."""
        if self.layer_rules is None:
            return [(list(range(num_kv_heads)), self.rule)]
        groups = [(sorted(h), r) for h, r in self.layer_rules(layer, num_kv_heads) if h]
        seen = sorted(i for h, _ in groups for i in h)
        if seen != list(range(num_kv_heads)):
            raise ValueError(
                f"the {self.name} policy splits layer {layer}'s key/value heads as {[h for h, _ in groups]}; "
                f"it must name each of the {num_kv_heads} heads exactly once"
            )
        return groups

    @property
    def full(self) -> bool:
        return self.layer_rules is None and isinstance(self.rule, Full)


def _check_budget(budget: int | None, least: int, what: str) -> int:
    if budget is None or isinstance(budget, bool) or not isinstance(budget, int) or budget < least:
        raise ValueError(f"the {what} policy needs a budget of at least {least} keys per head, got {budget}")
    return budget


def full_policy(budget: int | None = None) -> KVPolicy:
    """Every key: today's cache. It has no budget: one given is refused rather than ignored."""
    if budget is not None:
        raise ValueError(
            f"the full policy keeps every key and takes no budget (got {budget!r}); drop the budget, or choose a "
            f"policy that keeps {budget!r} keys per head: {', '.join(n for n in KV_POLICIES if n != 'full')}"
        )
    return KVPolicy("full")


def window_policy(budget: int | None = None, *, sinks: int = 4) -> KVPolicy:
    """``sinks`` first keys + the most recent ``budget - sinks`` (StreamingLLM at original positions)."""
    b = _check_budget(budget, sinks + 1, "window")
    return KVPolicy("window", SinksWindow(sinks, b - sinks))


def h2o_policy(budget: int | None = None) -> KVPolicy:
    """Half the budget for the most recent keys, half for the heavy hitters (the paper's even split)."""
    b = _check_budget(budget, 1, "h2o")
    recent = max(1, b - b // 2)
    return KVPolicy("h2o", HeavyHitters(b - recent, recent))


def snapkv_policy(budget: int | None = None, *, window: int = 32, kernel: int = 7) -> KVPolicy:
    """SnapKV with the paper's observation window (32) and pooling kernel (7)."""
    b = _check_budget(budget, 1, "snapkv")
    return KVPolicy("snapkv", SnapKV(b, window, kernel))


def head_aware_policy(budget: int | None = None, *, full_heads: Sequence[Sequence[int]] = (), sinks: int = 4):
    """Every key for the key/value heads in ``full_heads[layer]``, ``sinks`` + the most recent ``budget - sinks``
    for the others (``full_heads``: from :func:`multihead.interpret.kv_heads.classify`)."""
    b = _check_budget(budget, sinks + 1, "head-aware")
    keep_all = split_heads(full_heads)
    if not keep_all:
        raise ValueError(
            "the head-aware policy needs the retrieval heads of every layer (full_heads=): run "
            "`multihead heads MODEL --kv --out DIR` and pass DIR/kv-heads.json"
        )
    streaming = SinksWindow(sinks, b - sinks)

    def split(layer: int, num_kv_heads: int) -> list[tuple[list[int], Rule]]:
        if layer >= len(keep_all):
            raise ValueError(
                f"the head-aware split names {len(keep_all)} layers; this model has more (layer {layer}): "
                "classify the heads of this model"
            )
        chosen = keep_all[layer]
        if any(h >= num_kv_heads for h in chosen):
            raise ValueError(
                f"the head-aware split names key/value heads {chosen} in layer {layer}, which has "
                f"{num_kv_heads}: classify the heads of this model"
            )
        rest = [h for h in range(num_kv_heads) if h not in chosen]
        return [(chosen, Full()), (rest, streaming)]

    return KVPolicy("head-aware", streaming, split, layers=len(keep_all))


def split_heads(full_heads) -> list[list[int]]:
    """``full_heads`` as one sorted list of key/value head indices per layer, or a refusal naming the shape."""
    shape = (
        "full_heads is a list with one list of key/value head indices per layer, e.g. [[0], [1, 2], []] "
        "(split.full_heads of kv-heads.json)"
    )
    if isinstance(full_heads, (str, bytes)) or not isinstance(full_heads, Sequence):
        raise ValueError(f"{shape}; got {type(full_heads).__name__} {str(full_heads)[:40]!r}")
    out = []
    for i, layer in enumerate(full_heads):
        if isinstance(layer, (str, bytes)) or not isinstance(layer, (Sequence, set, frozenset)):
            raise ValueError(f"{shape}; layer {i} is {type(layer).__name__} {str(layer)[:40]!r}")
        heads = set()
        for h in layer:
            if isinstance(h, bool) or not isinstance(h, int) or h < 0:
                raise ValueError(f"{shape}; layer {i} names {h!r}, not a head index (a whole number >= 0)")
            heads.add(int(h))
        out.append(sorted(heads))
    return out


KV_POLICIES: dict[str, Callable[..., KVPolicy]] = {
    "full": full_policy,
    "window": window_policy,
    "h2o": h2o_policy,
    "snapkv": snapkv_policy,
    "head-aware": head_aware_policy,
}


def make_policy(name: str | KVPolicy, budget: int | None = None, **options) -> KVPolicy:
    """A :class:`KVPolicy` from its name in :data:`KV_POLICIES` (or one given as is)."""
    if isinstance(name, KVPolicy):
        return name
    if not isinstance(name, str) or name not in KV_POLICIES:
        raise ValueError(f"unknown KV policy {name!r}; choose one of {sorted(KV_POLICIES)}")
    import inspect

    make = KV_POLICIES[name]
    takes = [p for p in inspect.signature(make).parameters if p != "budget"]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ValueError(
            f"the {name} policy takes no option {', '.join(unknown)}; "
            + (f"its options: {', '.join(takes)}" if takes else "it takes only a budget")
        )
    return make(budget, **options)


# ---------------------------------------------------------------------------------------------------- the cache
def received_attention(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    window: int | None = None,
    sinks: Tensor | None = None,
    last: int | None = None,
    chunk: int = OBSERVE_CHUNK,
) -> Tensor:
    """``(B, H, N)``: the attention each key received, summed over the queries (the last ``last`` only, if given).

    ``q`` ``(B, H, Q, D)``, ``k`` ``(B, G, N, D)`` (rotated), ``q_pos`` ``(B, Q)``, ``k_pos`` ``(B, G, N)``: a query
    sees keys at or before its position (and within ``window`` of it on a sliding-window layer). The weights are the
    reference formula (:func:`multihead.attention.attention_weights`), computed ``chunk`` query rows at a time."""
    from ..attention.registry import attention_weights

    b, h, nq, _ = q.shape
    g = k.shape[1]
    start = 0 if last is None else max(nq - last, 0)
    total = q.new_zeros(b, h, k.shape[2], dtype=torch.float32)
    kp = k_pos.repeat_interleave(h // g, 1)[:, :, None, :]  # (B, H, 1, N)
    for s in range(start, nq, chunk):
        qp = q_pos[:, None, s : s + chunk, None]  # (B, 1, c, 1)
        allowed = kp <= qp
        if window is not None:
            allowed = allowed & (kp > qp - window)
        w = attention_weights(q[:, :, s : s + chunk].float(), k.float(), mask=allowed, sinks=sinks)  # (B, H, c, N)
        total += w.sum(2)
    return total


def _per_kv_head(score: Tensor, g: int) -> Tensor:
    """``(B, H, N)`` query-head scores summed over each key/value head's group: ``(B, G, N)``."""
    b, h, n = score.shape
    return score.view(b, g, h // g, n).sum(2)


class _Group:
    """One group of key/value heads under one rule: keys/values ``(B, G, N, D)`` in a buffer with room for one
    more step, their positions ``(B, G, N)`` and, for H2O, their accumulated attention ``(B, G, N)``."""

    def __init__(self, kv_heads: list[int], rule: Rule, q_per_kv: int) -> None:
        self.kv_heads, self.rule = kv_heads, rule
        self.q_heads = [g * q_per_kv + i for g in kv_heads for i in range(q_per_kv)]
        self.buffers = LayerKV()
        self.pos: Tensor | None = None
        self.score: Tensor | None = None
        self._index: dict = {}

    def index(self, device) -> tuple[Tensor, Tensor]:
        """This group's query-head and key/value-head indices on ``device``, made once."""
        if device not in self._index:
            self._index[device] = (
                torch.tensor(self.q_heads, device=device),
                torch.tensor(self.kv_heads, device=device),
            )
        return self._index[device]

    @property
    def length(self) -> int:
        return self.buffers.length

    def append(self, k: Tensor, v: Tensor, q_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        new_pos = q_pos[:, None, :].expand(k.shape[0], k.shape[1], -1)  # (B, G, Q)
        kk, vv = self.buffers.append(k, v)
        self.pos = new_pos.clone() if self.pos is None else torch.cat([self.pos, new_pos], -1)
        return kk, vv, self.pos

    def observe(self, score: Tensor | None) -> None:
        """Add this call's received attention ``(B, G, N)`` (new keys start from what they received now)."""
        if score is None:
            return
        if self.score is None or self.rule.scores == "observed":
            self.score = score
        else:
            grown = F.pad(self.score, (0, score.shape[-1] - self.score.shape[-1]))
            self.score = grown + score

    def evict(self, index: Tensor | None, room: int) -> None:
        """Keep slots ``index`` ``(B, G, M)`` (None: all) in fresh buffers of ``M + room`` positions."""
        if index is None:
            return
        k, v, m = self.buffers.k, self.buffers.v, index.shape[-1]
        assert k is not None and v is not None and self.pos is not None
        gather = index[..., None].expand(-1, -1, -1, k.shape[-1])  # (B, G, M, D)
        new_k = k.new_empty(k.shape[0], k.shape[1], m + room, k.shape[3])
        new_v = v.new_empty(v.shape[0], v.shape[1], m + room, v.shape[3])
        new_k[:, :, :m] = k.gather(2, gather)
        new_v[:, :, :m] = v.gather(2, index[..., None].expand(-1, -1, -1, v.shape[-1]))
        self.buffers._k, self.buffers._v, self.buffers.length = new_k, new_v, m
        self.pos = self.pos.gather(-1, index)
        if self.score is not None and self.rule.scores == "received":
            self.score = self.score.gather(-1, index)
        else:
            self.score = None

    def nbytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for t in (self.pos, self.score) if t is not None)
        return self.buffers.nbytes() + extra


class PolicyKV(LayerKV):
    """One self-attention layer's cache under a :class:`KVPolicy`: its key/value heads in groups, each with its own
    buffers and rule. It speaks the cache protocol of :class:`~multihead.modules.kv_cache.LayerKV`:
    :meth:`update` appends and answers one view per group (the module attends each), :meth:`done` scores and
    evicts.

    ``window``: the layer's sliding window (its keys past it are dropped). ``record``: keep both scores of the
    prompt (received and observed) so that :meth:`KVCache.compress` can apply any policy afterwards."""

    def __init__(self, groups: list[tuple[list[int], Rule]], *, window: int | None = None, record: bool = False):
        super().__init__()
        self.spec, self.window, self.record = groups, window, record
        self.groups: list[_Group] | None = None
        self.seen = 0
        self.recorded: dict[str, Tensor] = {}
        self._call: list = []  # the groups of the call in flight, between update and done
        self._positions: Tensor | None = None

    # LayerKV's view: the single group's buffers (multi-group layers have no one (B, G, N, D) tensor)
    @property
    def k(self) -> Tensor | None:
        return None if not self.groups else self._one().buffers.k

    @property
    def v(self) -> Tensor | None:
        return None if not self.groups else self._one().buffers.v

    @property
    def length(self) -> int:  # the most keys any head holds
        return max((g.length for g in self.groups), default=0) if self.groups else 0

    @length.setter
    def length(self, value: int) -> None:  # LayerKV.__init__ sets it; the groups hold the lengths
        pass

    def _one(self) -> _Group:
        assert self.groups is not None
        if len(self.groups) > 1:
            raise ValueError(
                "this layer's key/value heads are split into groups with their own keys (a head-aware policy): "
                "read each group's keys through .groups"
            )
        return self.groups[0]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise ValueError(
            "a KV-policy cache is updated through the cache protocol (PolicyKV.update, then done), not by "
            "appending keys; multi-head latent attention keeps its latents in a plain cache (policy='full')"
        )

    def reorder(self, index: Tensor) -> None:
        raise ValueError(
            "a KV-policy cache evicts keys per row; beam search reorders rows and needs the full cache "
            "(use greedy or sampling with a policy, or policy='full')"
        )

    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups or [])

    def kv_nbytes(self) -> int:
        """Bytes of the kept keys and values alone (what the policy saves), as filled."""
        return sum(g.buffers.kv_nbytes() for g in self.groups or [])

    def _start(self, g: int, h: int) -> list[_Group]:
        if self.groups is None:
            names = sorted(i for heads, _ in self.spec for i in heads)
            if names != list(range(g)):
                raise ValueError(
                    f"this cache was made for key/value heads {names}, but the layer has {g}: make the cache "
                    "with the model's new_cache(policy=...)"
                )
            self.groups = [_Group(heads, rule, h // g) for heads, rule in self.spec]
        return self.groups

    def update(self, q: Tensor, k: Tensor, v: Tensor, *, mask=None, rotary=None, positions=None):
        """Rotate this call's ``q`` ``(B, H, Q, D)`` and ``k`` ``(B, G, Q, D)`` at their positions, append each
        group's keys, and answer one :class:`KVView` per group: its kept keys plus the new ones. ``mask``: the call's
        mask, used as it is while the cache is empty (the prompt); afterwards masks are built from the kept keys'
        positions. Scoring and eviction wait for :meth:`done`."""
        b, h, nq, _ = q.shape
        groups = self._start(k.shape[1], h)
        if rotary is not None:
            q, k = rotary.rotate_pair(q, k, self.seen, positions)
        if positions is None:
            positions = torch.arange(self.seen, self.seen + nq, device=q.device).expand(b, nq)
        multi = len(groups) > 1
        views, self._call = [], []
        for grp in groups:
            prompt = grp.length == 0
            idx, kv_idx = grp.index(q.device) if multi else (None, None)
            kg = k if kv_idx is None else k.index_select(1, kv_idx)
            vg = v if kv_idx is None else v.index_select(1, kv_idx)
            kk, vv, kpos = grp.append(kg, vg, positions)
            views.append(KVView(kk, vv, mask if prompt else self._mask(positions, kpos, h // k.shape[1]), idx))
            self._call.append((grp, kpos, prompt))
        self._positions = positions
        return q, views

    def done(self, q: Tensor, views: list[KVView], sinks: Tensor | None = None) -> None:
        """Score this call's keys where the groups' rules need it, then evict each group to its budget."""
        assert self._positions is not None, "done() follows update()"
        sinks = None if sinks is None else sinks.detach().float()
        for (grp, kpos, prompt), view in zip(self._call, views):
            qg = q if view.heads is None else q.index_select(1, view.heads)
            gsinks = sinks if sinks is None or view.heads is None else sinks[view.heads]
            self._score(grp, qg, view.k, self._positions, kpos, gsinks, prompt)
            if self.window is not None:  # a sliding-window layer: only the last window - 1 keys can be read again
                index = SinksWindow(0, max(self.window - 1, 1)).keep(kpos, None, prompt=prompt)
            else:
                index = None if self.record else grp.rule.keep(kpos, grp.score, prompt=prompt)
            grp.evict(index, room=1)
        self.seen += q.shape[2]
        self._call = []

    def _mask(self, q_pos: Tensor, k_pos: Tensor, q_per_kv: int) -> Tensor | None:
        """``(B, H, Q, N)`` bool from positions (None for one query over keys all before it, in the window)."""
        if q_pos.shape[1] == 1:
            return None  # every kept key is earlier, and eviction already dropped what the window excludes
        qp = q_pos[:, None, :, None]  # (B, 1, Q, 1)
        kp = k_pos.repeat_interleave(q_per_kv, 1)[:, :, None, :]  # (B, H, 1, N)
        allowed = kp <= qp
        if self.window is not None:
            allowed = allowed & (kp > qp - self.window)
        return allowed

    def _score(self, grp: _Group, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, sinks, prompt: bool) -> None:
        g = k.shape[1]
        if self.window is not None:  # a sliding-window layer keeps its window whatever the scores
            return
        if self.record and prompt:  # both scores once, so that any policy can be applied afterwards
            s = received_attention(q, k, q_pos, k_pos, sinks=sinks)
            self.recorded["received"] = _per_kv_head(s, g)
            self.recorded["observed_heads"] = received_attention(q, k, q_pos, k_pos, sinks=sinks, last=SNAPKV_WINDOW)
            return
        kind = grp.rule.scores
        if not kind or (kind == "observed" and not prompt):
            return
        s = received_attention(q, k, q_pos, k_pos, sinks=sinks, last=grp.rule.observed())
        grp.observe(_per_kv_head(grp.rule.smooth(s), g))


def policy_cache(policy: KVPolicy, num_kv_heads: Sequence[int], windows: Sequence[int | None], *, record: bool = False):
    """A :class:`~multihead.modules.kv_cache.KVCache` whose self-attention layers follow ``policy``:
    ``num_kv_heads[i]`` and ``windows[i]`` (the sliding window, None for a global layer) per layer. Under ``full``
    the global layers get the plain :class:`LayerKV` (bit-identical to a cache made without a policy). ``record``:
    every key is kept and the prompt's scores are recorded, so that :meth:`KVCache.compress` can apply any policy
    (and budget) to one prefill."""
    from .kv_cache import KVCache

    policy.check(num_kv_heads)
    layers: list[LayerKV] = []
    for i, (g, w) in enumerate(zip(num_kv_heads, windows)):
        if record:
            layers.append(PolicyKV([(list(range(g)), Full())], window=w, record=True))
        elif policy.full and w is None:
            layers.append(LayerKV())
        else:
            layers.append(PolicyKV(policy.rules(i, g), window=w))
    return KVCache(len(layers), self_attn=layers, policy=policy)


def compress(cache, policy: KVPolicy):
    """A new cache holding what ``policy`` would have kept had the prompt been read under it: ``cache`` is a
    recorded one (:func:`policy_cache` with ``record=True``) after the prompt. Bit-identical to a prefill under
    ``policy`` (the scores are the same numbers); ``cache`` itself is left as it was, so one prefill serves every
    policy and budget."""
    from .kv_cache import KVCache

    policy.check_layers(len(cache.self_attn))
    layers: list[LayerKV] = []
    for i, rec in enumerate(cache.self_attn):
        if not isinstance(rec, PolicyKV) or not rec.record or not rec.groups:
            raise ValueError(
                "compress takes a recorded cache after its prompt: make it with new_cache(record=True) and run "
                "the prompt through it first"
            )
        whole = rec.groups[0]
        k, v, pos = whole.buffers.k, whole.buffers.v, whole.pos
        assert k is not None and v is not None and pos is not None
        new = PolicyKV(policy.rules(i, k.shape[1]), window=rec.window)
        new.groups, new.seen = [], rec.seen
        h = len(whole.q_heads)
        for heads, rule in new.spec:
            grp = _Group(heads, rule, h // k.shape[1])
            sel = torch.tensor(heads, device=k.device)
            every = heads == list(range(k.shape[1]))  # one group of every head: the recording's own tensors, no copy
            # (safe: an append past a stored buffer reallocates, and eviction gathers into new buffers)
            grp.buffers.store(k if every else k.index_select(1, sel), v if every else v.index_select(1, sel))
            grp.pos = pos if every else pos.index_select(1, sel)
            if rule.scores and rec.window is None:
                if rule.scores == "observed" and rule.observed() != SNAPKV_WINDOW:
                    raise ValueError(
                        f"a recorded prompt keeps the scores of its last {SNAPKV_WINDOW} queries; this rule "
                        f"observes {rule.observed()} (prefill under the policy instead)"
                    )
                if rule.scores == "received":
                    score = rec.recorded["received"]  # (B, G, N) summed per key/value head
                else:  # smoothed per query head, then summed per key/value head, as in a direct prefill
                    score = _per_kv_head(rule.smooth(rec.recorded["observed_heads"]), k.shape[1])
                grp.observe(score.index_select(1, sel))
            index = None if rec.window is not None else rule.keep(grp.pos, grp.score, prompt=True)
            grp.evict(index, 1)
            new.groups.append(grp)
        layers.append(new)
    out = KVCache(len(layers), self_attn=layers, policy=policy)
    out.key_padding, out.next_position = cache.key_padding, cache.next_position
    return out


SNAPKV_WINDOW = 32  # the observation window SnapKV's paper uses (a recorded prompt keeps these queries' scores)


def _pool(score: Tensor, kernel: int, window: int) -> Tensor:
    """SnapKV's smoothing: the observed scores ``(B, H, N)`` of the keys before the observation window average-pooled
    over ``kernel`` neighbours (the window's own keys are kept anyway)."""
    n = score.shape[-1]
    head = score[..., : max(n - window, 0)]
    if head.shape[-1] == 0:
        return score
    b, h, m = head.shape
    pooled = F.avg_pool1d(head.reshape(b * h, 1, m), kernel, stride=1, padding=kernel // 2).view(b, h, m)
    return torch.cat([pooled, score[..., m:]], -1)


__all__ = [
    "Full",
    "HeavyHitters",
    "KVPolicy",
    "KV_POLICIES",
    "PolicyKV",
    "Rule",
    "SinksWindow",
    "SnapKV",
    "compress",
    "make_policy",
    "split_heads",
    "policy_cache",
    "received_attention",
]
