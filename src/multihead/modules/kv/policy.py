"""What a KV policy is (:class:`KVPolicy`), the one list of them (:data:`KV_POLICIES`, filled by :func:`register`;
the command line, ``kv``, ``bench decode`` and ``bench kv`` read the names there; :func:`make_policy` makes one from
its name, budget and options), and the layer cache a policy runs in (:class:`PolicyKV`): a layer's key/value heads
in groups, each with its own buffers and rule. :func:`policy_cache` makes a whole decoder's;
:meth:`KVCache.compress <multihead.modules.kv.cache.KVCache.compress>` applies a policy to a recorded prompt.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads (of one group), ``N`` kept positions, ``Q`` query
positions of a call, ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor

from .cache import KVCache, LayerKV
from .layer import KVView, LayerCache
from .observe import Observed, _arange

KV_POLICIES: dict[str, type[KVPolicy]] = {}  # the one list of policy names: name -> class (filled by @register)


def register(cls):
    """Add a :class:`KVPolicy` subclass to :data:`KV_POLICIES` under its ``name``: the command line, ``kv`` and
    ``bench decode`` read the names from there."""
    if not cls.name or cls.name in KV_POLICIES:
        raise ValueError(f"a KV policy needs a name of its own, got {cls.name!r}")
    KV_POLICIES[cls.name] = cls
    return cls


def _check_budget(budget: int | None, least: int, what: str) -> int:
    if budget is None or isinstance(budget, bool) or not isinstance(budget, int) or budget < least:
        raise ValueError(f"the {what} policy needs a budget of at least {least} keys per head, got {budget}")
    return budget


class KVPolicy:
    """Which cached keys each key/value head keeps. One class per policy, registered by name (:func:`register`):
    :meth:`score` ranks the keys from what a call :class:`Observed`, :meth:`keep` picks the slots that stay after the
    call, :meth:`groups` gives a layer's heads different policies (the head-aware split), :meth:`of_budget` makes the
    policy from the command line's budget and options. ``observes``: the prompt's last queries a policy's score
    reads (None: every query), so that a recorded prompt keeps those sums."""

    name: ClassVar[str] = ""
    observes: ClassVar[tuple[int | None, ...]] = ()
    accumulates: ClassVar[bool] = False  # its score carries over calls (summed), so eviction keeps it per slot
    budgeted: ClassVar[bool] = True  # it takes a budget (keys per head)
    needs_split: ClassVar[bool] = False  # it takes a per-layer split of the heads (full_heads=, kv-heads.json)

    @classmethod
    def of_budget(cls, budget: int | None = None) -> KVPolicy:
        """The policy keeping ``budget`` keys per head (subclasses add their options as keywords)."""
        raise NotImplementedError

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        """``(B, G, N)`` per key/value head for the kept keys plus this call's (``previous``: the last call's, for
        the slots kept then), or None: this policy needs no score."""
        return None

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        """Slots to keep ``(B, G, M)`` (ascending) out of ``pos`` ``(B, G, N)``, or None to keep all. ``prompt``:
        this is the first call (the prompt)."""
        return None

    @property
    def budget(self) -> int | None:
        """Keys kept per head after each call (None: no bound)."""
        return None

    def groups(self, layer: int, num_kv_heads: int, num_layers: int) -> list[tuple[list[int], KVPolicy]]:
        """The key/value heads of ``layer`` in groups, each under its own policy (default: one group, this one)."""
        return [(list(range(num_kv_heads)), self)]

    def share(self, scores: list[Tensor | None], *, prompt: bool) -> list[KVPolicy] | None:
        """A decision over the whole layer: given every group's score of this call, the policy each group keeps by
        now (per-head budgets), or None: each group keeps by its own."""
        return None

    @classmethod
    def why_not(cls, where: str) -> str | None:
        """Why this policy cannot serve ``where`` (``"attached"``: an HF model through
        :class:`multihead.hf.PolicyCache`; ``"recorded"``: a recorded prompt, :meth:`KVCache.compress`), or None."""
        return None

    def layer_cache(self, layer: int, num_kv_heads: int, num_layers: int, window: int | None) -> LayerCache:
        """The cache of self-attention layer ``layer`` (``window``: its sliding window, None for a global layer)."""
        return PolicyKV(self.rules(layer, num_kv_heads, num_layers), window=window, policy=self)

    # -- the cache's questions, the same for every policy
    layers: int | None = None  # the layers a per-layer split was made for (None: any model)

    @property
    def rule(self) -> KVPolicy:
        """The policy of a layer's single group (itself; kept for the spelling of earlier releases)."""
        return self

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
            self.rules(i, g, len(num_kv_heads))

    def rules(self, layer: int, num_kv_heads: int, num_layers: int = 0) -> list[tuple[list[int], KVPolicy]]:
        """The groups of ``layer`` (:meth:`groups`), checked: every head in exactly one group."""
        groups = [(sorted(h), r) for h, r in self.groups(layer, num_kv_heads, num_layers) if h]
        seen = sorted(i for h, _ in groups for i in h)
        if seen != list(range(num_kv_heads)):
            raise ValueError(
                f"the {self.name} policy splits layer {layer}'s key/value heads as {[h for h, _ in groups]}; "
                f"it must name each of the {num_kv_heads} heads exactly once"
            )
        return groups

    full: ClassVar[bool] = False  # it keeps every key (the plain cache)

    def compress(self, cache, *, prompt_only: bool = False):
        """What this policy keeps of the recorded ``cache``'s prompt, as a new cache (:meth:`KVCache.compress`)."""
        return cache.compress(self, prompt_only=prompt_only)


Rule = KVPolicy  # the name a group's policy had in earlier releases


def make_policy(name: str | KVPolicy, budget: int | None = None, **options) -> KVPolicy:
    """A :class:`KVPolicy` from its name in :data:`KV_POLICIES` (or one given as is)."""
    if isinstance(name, KVPolicy):
        return name
    if not isinstance(name, str) or name not in KV_POLICIES:
        raise ValueError(f"unknown KV policy {name!r}; choose one of {sorted(KV_POLICIES)}")
    import inspect

    make = KV_POLICIES[name].of_budget
    params = inspect.signature(make).parameters
    takes = [p for p in params if p != "budget"]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ValueError(
            f"the {name} policy takes no option {', '.join(unknown)}; "
            + (f"its options: {', '.join(takes)}" if takes else "it takes only a budget")
        )
    return make(budget, **_whole_numbers(name, params, options))


def _whole_numbers(name: str, params, options: dict) -> dict:
    """``options`` with every option whose default is a whole number checked as one: a bool is not (``sinks=True``
    is refused, not read as 1), nor a float or a string. Each policy checks the range of its own options."""
    import numbers

    out = dict(options)
    for key, value in options.items():
        default = params[key].default
        if not isinstance(default, int) or isinstance(default, bool):
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"the {name} policy's {key} is a whole number (default {default}), got {value!r}")
        out[key] = int(value)
    return out


class ObservesWindow:
    """``observes`` of a policy that reads its prompt's last ``window`` queries: read on the class, the default
    window's (the dataclass field's default); on an instance, that instance's own, so that a prompt recorded for it
    keeps the window it reads."""

    def __get__(self, obj, owner=None) -> tuple[int | None, ...]:
        return ((owner if obj is None else obj).window,)


def recorded_windows(policies=None) -> tuple:
    """What a recorded prompt keeps, so that ``policies`` (policies or their classes; None: every registered one)
    can be applied to it afterwards: the query windows it sums the received attention over (an int or None, every
    query) and the query statistics (``("queries", skip)``) they observe (:meth:`Observed.observe`)."""
    chosen = KV_POLICIES.values() if policies is None else policies
    return tuple(dict.fromkeys(w for p in chosen for w in p.observes))


def full_policy(budget: int | None = None) -> KVPolicy:
    """Deprecated spelling of ``make_policy("full")``."""
    return _deprecated("full", budget)


def window_policy(budget: int | None = None, **options) -> KVPolicy:
    """Deprecated spelling of ``make_policy("window", budget)``."""
    return _deprecated("window", budget, **options)


def h2o_policy(budget: int | None = None) -> KVPolicy:
    """Deprecated spelling of ``make_policy("h2o", budget)``."""
    return _deprecated("h2o", budget)


def snapkv_policy(budget: int | None = None, **options) -> KVPolicy:
    """Deprecated spelling of ``make_policy("snapkv", budget)``."""
    return _deprecated("snapkv", budget, **options)


def head_aware_policy(budget: int | None = None, **options) -> KVPolicy:
    """Deprecated spelling of ``make_policy("head-aware", budget, full_heads=...)``."""
    return _deprecated("head-aware", budget, **options)


def _deprecated(name: str, budget, **options) -> KVPolicy:
    import warnings

    warnings.warn(
        f"{name.replace('-', '_')}_policy is deprecated; use make_policy({name!r}, budget, ...)", DeprecationWarning, 3
    )
    return make_policy(name, budget, **options)


class _Group:
    """One group of key/value heads under one rule: keys/values ``(B, G, N, D)`` in a buffer with room for one
    more step, their positions ``(B, G, N)`` and, for H2O, their accumulated attention ``(B, G, N)``."""

    def __init__(self, kv_heads: list[int], rule: KVPolicy, q_per_kv: int) -> None:
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

    def observe(self, seen: Observed, *, prompt: bool) -> None:
        """This group's policy scores its keys from what the call ``seen`` (None: it keeps its last score)."""
        score = self.rule.score(seen, self.score, prompt=prompt)
        if score is not None:
            self.score = score

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
        if self.score is not None and self.rule.accumulates:
            self.score = self.score.gather(-1, index)
        else:
            self.score = None

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the keys, values, positions and scores."""
        self.buffers.reorder(index)
        self.pos = None if self.pos is None else self.pos.index_select(0, index)
        self.score = None if self.score is None else self.score.index_select(0, index)

    def nbytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for t in (self.pos, self.score) if t is not None)
        return self.buffers.nbytes() + extra


class PolicyKV:
    """One self-attention layer's cache under a :class:`KVPolicy`: its key/value heads in groups, each with its own
    buffers and rule. It implements the layer-cache protocol (:class:`~multihead.modules.kv.layer.LayerCache`):
    :meth:`update` appends and answers one view per group (the module attends each), :meth:`done` scores and
    evicts, :meth:`reorder` keeps rows (each row's kept keys go with it).

    ``window``: the layer's sliding window (its keys past it are dropped). ``record``: the query windows and
    statistics to record (:func:`recorded_windows`; True: every registered policy's): every key is kept and the
    prompt's attention sums over those windows, so that :meth:`compressed` can apply any policy afterwards."""

    static = False

    def __init__(
        self,
        groups: list[tuple[list[int], KVPolicy]],
        *,
        window: int | None = None,
        record: bool | tuple = False,
        policy: KVPolicy | None = None,
        rope: Tensor | None | bool = None,
        prompt_only: bool = False,
    ):
        self.spec, self.window, self.policy = groups, window, policy
        # what a recording keeps: the query windows and statistics of every registered policy (True) or those given
        self.record = record is not False
        self.windows: tuple = recorded_windows() if record is True else () if record is False else tuple(record)
        self.prompt_only = prompt_only
        # the rotary frequencies the keys are turned with (None: not rotated; False: unknown); a native model's
        # rotary module tells them at the first call, an HF model's cache is told when it is made
        self.rope = rope
        self.groups: list[_Group] | None = None
        self.seen = 0
        self.recorded: dict = {}  # the prompt's sums per query window (a recording cache)
        self._call: list = []  # the groups of the call in flight, between update and done
        self._positions: Tensor | None = None

    @property
    def length(self) -> int:
        """The most keys any head holds."""
        return max((g.length for g in self.groups), default=0) if self.groups else 0

    def source(self) -> None:
        """A policy cache serves self-attention: the call's keys are always projected."""
        return None

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index``, in place: each row's kept keys, their positions and scores go with it (every row of a
        group holds the same number of keys, each row its own)."""
        for grp in self.groups or []:
            grp.reorder(index)

    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups or [])

    def kv_nbytes(self) -> int:
        """Bytes of the kept keys and values alone (what the policy saves), as filled."""
        return sum(g.buffers.kv_nbytes() for g in self.groups or [])

    def positions(self) -> list[Tensor]:
        """Which keys each key/value head holds: their positions in the sequence, ``(B, N)`` per head in head order
        (heads under different rules may hold different numbers; an empty list before the first call)."""
        held = {
            h: grp.pos[:, i] for grp in self.groups or [] if grp.pos is not None for i, h in enumerate(grp.kv_heads)
        }
        return [held[h] for h in sorted(held)]

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
            self.rope = getattr(rotary, "inv_freq", False)
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
            self._score(grp, qg, view, self._positions, kpos, gsinks, prompt)
        self._cut([(grp, kpos) for grp, kpos, _ in self._call], prompt=self._call[0][2])
        self.seen += q.shape[2]
        self._call = []

    def _cut(self, groups: list[tuple[_Group, Tensor]], *, prompt: bool) -> None:
        """Evict each group to what its policy keeps (the layer's policy may decide the groups' budgets together,
        :meth:`KVPolicy.share`)."""
        if self.window is not None:  # a sliding-window layer: only the last window - 1 keys can be read again
            recent = max(self.window - 1, 1)
            for grp, kpos in groups:
                n = kpos.shape[-1]
                grp.evict(None if n <= recent else _arange(recent, kpos, n - recent), room=1)
            return
        if self.record or (self.prompt_only and not prompt):
            return
        shared = None if self.policy is None else self.policy.share([g.score for g, _ in groups], prompt=prompt)
        for (grp, kpos), rule in zip(groups, shared or [g.rule for g, _ in groups]):
            grp.evict(rule.keep(kpos, grp.score, prompt=prompt), room=1)

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

    def _score(self, grp: _Group, q: Tensor, view: KVView, q_pos: Tensor, k_pos: Tensor, sinks, prompt: bool) -> None:
        if self.window is not None or (self.prompt_only and not prompt):  # a window keeps its window; a prompt-only
            return  # policy scored once
        seen = Observed(view.k, q, q_pos, k_pos, sinks, values=view.v, rope=self.rope)
        if self.record and prompt:  # what every policy reads, once, so that any can be applied afterwards
            self.recorded = {key: seen.observe(key) for key in self.windows}
            return
        grp.observe(seen, prompt=prompt)

    def compressed(self, policy: KVPolicy, layer: int, num_layers: int, *, prompt_only: bool = False) -> PolicyKV:
        """What ``policy`` keeps of this recorded layer's prompt, as a new layer cache (this one is unchanged):
        the same keys, values and scores a prefill under the policy leaves."""
        if not self.record or not self.groups:
            raise ValueError(
                "compress takes a recorded cache after its prompt: make it with new_cache(record=True) and run "
                "the prompt through it first"
            )
        whole = self.groups[0]
        k, v, pos = whole.buffers.k, whole.buffers.v, whole.pos
        assert k is not None and v is not None and pos is not None
        new = PolicyKV(policy.rules(layer, k.shape[1], num_layers), window=self.window, policy=policy)
        new.prompt_only, new.groups, new.seen, new.rope = prompt_only, [], self.seen, self.rope
        h = len(whole.q_heads)
        for heads, rule in new.spec:
            grp = _Group(heads, rule, h // k.shape[1])
            sel = torch.tensor(heads, device=k.device)
            every = heads == list(range(k.shape[1]))  # one group of every head: the recording's own tensors, no copy
            # (safe: an append past a stored buffer reallocates, and eviction gathers into new buffers)
            kg = k if every else k.index_select(1, sel)
            vg = v if every else v.index_select(1, sel)
            grp.buffers.store(kg, vg)
            grp.pos = pos if every else pos.index_select(1, sel)
            if self.window is None:  # the group's query heads' recorded sums, as a prefill under the policy sees them
                q_sel = torch.tensor(grp.q_heads, device=k.device)
                sums = {w: t if every else _heads(t, q_sel) for w, t in self.recorded.items()}
                grp.observe(
                    Observed(kg, recorded=sums, values=vg, rope=self.rope, next_position=self.seen), prompt=True
                )
            new.groups.append(grp)
        new._cut([(grp, grp.pos) for grp in new.groups if grp.pos is not None], prompt=True)
        return new


def policy_cache(
    policy: KVPolicy,
    num_kv_heads: Sequence[int],
    windows: Sequence[int | None],
    *,
    record: bool | Sequence = False,
    prompt_only: bool = False,
) -> KVCache:
    """A :class:`~multihead.modules.kv.cache.KVCache` whose self-attention layers follow ``policy``:
    ``num_kv_heads[i]`` and ``windows[i]`` (the sliding window, None for a global layer) per layer. Under ``full``
    the global layers get the plain :class:`~multihead.modules.kv.cache.LayerKV` (bit-identical to a cache made
    without a policy). ``record``: every key is kept and the prompt's scores are recorded, so that
    :meth:`KVCache.compress` can apply any policy (and budget) to one prefill; True records what every registered
    policy reads, a list of policies what those read (less work: the whole attention map only where one needs it).
    ``prompt_only``: the policy evicts once, after the prompt (:class:`PolicyKV`)."""
    policy.check(num_kv_heads)
    if record is not False and policy.why_not("recorded"):
        raise ValueError(policy.why_not("recorded"))
    if record is not False and record is not True:
        for p in record:
            if p.why_not("recorded"):
                raise ValueError(p.why_not("recorded"))
    layers: list = []
    for i, (g, w) in enumerate(zip(num_kv_heads, windows)):
        if record is not False:
            windows_of = recorded_windows(None if record is True else record)
            layers.append(PolicyKV([(list(range(g)), KVPolicy())], window=w, record=windows_of))  # keeps every key
            continue
        made = policy.layer_cache(i, g, len(num_kv_heads), w)
        if isinstance(made, PolicyKV):
            made.prompt_only = prompt_only
        layers.append(made)
    return KVCache(len(layers), self_attn=layers, policy=policy)


def compress(cache: KVCache, policy: KVPolicy, *, prompt_only: bool = False) -> KVCache:
    """What ``policy`` keeps of the recorded ``cache``'s prompt (:meth:`KVCache.compress`)."""
    return cache.compress(policy, prompt_only=prompt_only)


def _heads(recorded, q_heads: Tensor):
    """A recorded prompt's sums (or query statistics: a tuple) for the query heads ``q_heads`` only."""
    if isinstance(recorded, tuple):
        return tuple(t.index_select(1, q_heads) for t in recorded)
    return recorded.index_select(1, q_heads)
