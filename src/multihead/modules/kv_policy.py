"""KV cache policies: which cached keys each key/value head keeps while a causal LM decodes.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads (of one group), ``N`` kept positions, ``Q`` query
positions of a call, ``D`` head dim.

A policy is one class (a :class:`KVPolicy`, registered by name in :data:`KV_POLICIES`, the one list of names the
command line, ``kv`` and ``bench decode`` read) with its own :meth:`~KVPolicy.score` (what it ranks the keys by,
from what a call :class:`Observed`) and :meth:`~KVPolicy.keep` (the slots that stay):

* ``full`` -- every key (the plain :class:`~multihead.modules.kv_cache.LayerKV`, bit-identical to it);
* ``window`` -- the first ``sinks`` keys plus the most recent ones, at their original positions (StreamingLLM,
  Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks");
* ``h2o`` -- the most recent half plus the keys with the largest attention received so far, summed over every
  query that read them (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle");
* ``snapkv`` -- once, after the prompt: the keys that the prompt's last 32 queries attend to most, pooled over 7
  neighbours, plus those 32 (Li et al. 2024, "SnapKV"); generated keys are all kept, as in the paper;
* ``tova``, ``knorm``, ``pyramidkv`` -- the last query's attention (TOVA), the smallest key norms (Knorm),
  SnapKV with budgets falling with depth (PyramidKV);
* ``adakv`` -- SnapKV's scores with the layer's budget shared among its heads by one ranking (Ada-KV), each head
  stored at its own length;
* ``expected`` -- the attention the queries to come pay each key in expectation (kvpress's Expected Attention);
* ``streaming`` -- StreamingLLM with keys rotated at their slot in the cache (:class:`StreamingKV`);
* ``head-aware`` -- every key for the retrieval heads, sinks + window for the others (DuoAttention, Xiao et al.
  2024; RazorAttention, Tang et al. 2024): the split is read from :func:`multihead.interpret.kv.heads.classify`.

A call attends with every key it brings (a prompt is read whole, as every paper above does), then the cache is cut
to the budget: the evicted keys' memory is released (the buffers are rebuilt at the budget's size). Under grouped-
query attention a key/value head is shared by its query heads: scores are summed over the group, and the decision
is per shared head. Sliding-window layers (Gemma 3, Mistral) keep only their window under every policy, ``full``
included: the keys past it can never be read again.

A new policy is one class in this file: subclass :class:`KVPolicy`, give it a ``name``, :meth:`~KVPolicy.of_budget`,
:meth:`~KVPolicy.keep` and, if it ranks keys, :meth:`~KVPolicy.score`; decorate it with :func:`register`. A policy
that decides over a whole layer answers :meth:`~KVPolicy.share`, one that needs another layer cache
:meth:`~KVPolicy.layer_cache`, and :meth:`~KVPolicy.why_not` says where it cannot serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .kv_cache import KVView, LayerKV, StreamingKV

OBSERVE_CHUNK = 256  # query rows per block when the received attention is summed (bounded memory at long prompts)


# ---------------------------------------------------------------------------------------------------- scores
class Observed:
    """What a policy may read of one call to rank its keys: the attention each kept key received from the call's
    queries (:meth:`received`, per query head), the keys themselves ``(B, G, N, D)`` (rotated; rotation keeps their
    norms), and :meth:`per_kv_head` to sum query heads over the key/value head they share.

    Live (``q`` given) the sums are computed from the call's queries; recorded (``recorded``: ``{last: (B, H, N)}``
    from a prompt read with ``new_cache(record=True)``) they are read back, so that one prefill serves every
    policy."""

    def __init__(
        self,
        k: Tensor,
        q: Tensor | None = None,
        q_pos=None,
        k_pos=None,
        sinks=None,
        recorded=None,
        *,
        values: Tensor | None = None,
        rope: Tensor | None | bool = None,
        next_position: int | None = None,
    ):
        self.keys, self._q, self._q_pos, self._k_pos, self._sinks = k, q, q_pos, k_pos, sinks
        self.values = values  # (B, G, N, D), for the policies that weigh a key by its value's norm
        # the rotary frequencies (D'/2,) the keys and queries were turned with (None: no rotation; False: unknown)
        self.rope = rope
        self._next = next_position
        self._sums: dict = {} if recorded is None else dict(recorded)

    @property
    def next_position(self) -> int | None:
        """The position of the first token after this call (read from the queries' positions only when asked)."""
        if self._next is None and self._q_pos is not None:
            self._next = int(self._q_pos[:, -1].max()) + 1
        return self._next

    def observe(self, key):
        """What a recorded prompt keeps for ``key``: a query window (an int or None, :meth:`received`) or
        ``("queries", skip)`` (:meth:`queries`)."""
        return self.queries(key[1]) if isinstance(key, tuple) else self.received(key)

    def queries(self, skip: int = 0) -> tuple[Tensor, Tensor]:
        """The mean ``(B, H, D)`` and covariance ``(B, H, D, D)`` of the call's queries before their rotation,
        leaving out the first ``skip`` (the sinks' outliers): the statistics of the queries to come."""
        key = ("queries", skip)
        if key not in self._sums:
            if self._q is None:
                raise ValueError(
                    f"a recorded prompt keeps the statistics of its queries past the first "
                    f"{[k[1] for k in self._sums if isinstance(k, tuple)]}; this policy skips {skip} (prefill under "
                    "the policy instead)"
                )
            if self.rope is False:
                raise ValueError(
                    "this policy models the queries to come, which needs the model's rotary frequencies; this "
                    "model's could not be read (several rotary embeddings?): choose another policy"
                )
            q = self._q.float()
            if isinstance(self.rope, Tensor):  # back to the unrotated queries: turn each by minus its position
                q = _turn(q, self.rope, -self._q_pos.float()[:, None, :])
            q = q[:, :, skip:] if q.shape[2] > skip else q
            mu = q.mean(2)  # (B, H, D)
            centred = q - mu[:, :, None]
            self._sums[key] = (mu, torch.einsum("bhsi,bhsj->bhij", centred, centred) / q.shape[2])
        return self._sums[key]

    def received(self, last: int | None = None) -> Tensor:
        """``(B, H, N)``: the weight each key received, summed over the call's queries (its ``last`` ones only)."""
        if last not in self._sums:
            if self._q is None:
                raise ValueError(
                    f"a recorded prompt keeps the attention of its last {sorted(k for k in self._sums if k)} queries "
                    f"and of all of them; this policy reads its last {last} (prefill under the policy instead)"
                )
            self._sums[last] = received_attention(
                self._q, self.keys, self._q_pos, self._k_pos, sinks=self._sinks, last=last
            )
        return self._sums[last]

    def per_kv_head(self, score: Tensor) -> Tensor:
        """``(B, H, N)`` per query head -> ``(B, G, N)`` summed over each key/value head's query heads."""
        return _per_kv_head(score, self.keys.shape[1])


# ---------------------------------------------------------------------------------------------------- policies
KV_POLICIES: dict[str, type[KVPolicy]] = {}  # the one list of policy names: name -> class (filled by @register)


def register(cls):
    """Add a :class:`KVPolicy` subclass to :data:`KV_POLICIES` under its ``name``: the command line, ``kv`` and
    ``bench decode`` read the names from there."""
    if not cls.name or cls.name in KV_POLICIES:
        raise ValueError(f"a KV policy needs a name of its own, got {cls.name!r}")
    KV_POLICIES[cls.name] = cls
    return cls


def _arange(n: int, like: Tensor, start: int = 0) -> Tensor:
    return torch.arange(start, start + n, device=like.device).expand(*like.shape[:-1], n)


def _top(score: Tensor, n: int) -> Tensor:
    """Slots ``(B, G, n)`` with the largest ``score``, in position order."""
    return score.topk(n, dim=-1).indices.sort(-1).values


def _heavy_and_recent(score: Tensor, heavy: int, recent: int) -> Tensor:
    """Slots ``(B, G, heavy + recent)``: the ``recent`` last ones and, among the others, the ``heavy`` with the
    largest ``score``, all in position order."""
    n = score.shape[-1]
    return torch.cat([_top(score[..., : n - recent], heavy), _arange(recent, score, n - recent)], -1)


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

    def layer_cache(self, layer: int, num_kv_heads: int, num_layers: int, window: int | None) -> LayerKV:
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

    @property
    def full(self) -> bool:
        return isinstance(self, Full)

    def compress(self, cache, *, prompt_only: bool = False):
        """What this policy keeps of the recorded ``cache``'s prompt, as a new cache (:func:`compress`)."""
        return compress(cache, self, prompt_only=prompt_only)


Rule = KVPolicy  # the name a group's policy had in earlier releases


@register
@dataclass(frozen=True)
class Full(KVPolicy):
    """Every key: the plain cache (bit-identical to :class:`~multihead.modules.kv_cache.LayerKV`). It has no
    budget: one given is refused rather than ignored."""

    name: ClassVar[str] = "full"
    budgeted: ClassVar[bool] = False

    def layer_cache(self, layer: int, num_kv_heads: int, num_layers: int, window: int | None) -> LayerKV:
        return LayerKV() if window is None else super().layer_cache(layer, num_kv_heads, num_layers, window)

    @classmethod
    def of_budget(cls, budget: int | None = None) -> Full:
        if budget is not None:
            raise ValueError(
                f"the full policy keeps every key and takes no budget (got {budget!r}); drop the budget, or choose a "
                f"policy that keeps {budget!r} keys per head: {', '.join(n for n in KV_POLICIES if n != 'full')}"
            )
        return cls()


@register
@dataclass(frozen=True)
class SinksWindow(KVPolicy):
    """The first ``sinks`` keys and the ``window`` most recent ones, at their original positions (StreamingLLM, Xiao
    et al. 2023; ``sinks=0``: a plain sliding window)."""

    name: ClassVar[str] = "window"
    sinks: int = 4
    window: int = 60

    def __post_init__(self) -> None:
        if self.sinks < 0 or self.window < 1:
            raise ValueError(
                f"a sinks + window rule needs sinks >= 0 and window >= 1, got sinks={self.sinks}, "
                f"window={self.window}: a budget must leave at least one recent key after the sinks"
            )

    @classmethod
    def of_budget(cls, budget: int | None = None, *, sinks: int = 4) -> SinksWindow:
        b = _check_budget(budget, sinks + 1, "window")
        return cls(sinks, b - sinks)

    @property
    def budget(self) -> int:
        return self.sinks + self.window

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        n = pos.shape[-1]
        if n <= self.budget:
            return None
        return torch.cat([_arange(self.sinks, pos), _arange(self.window, pos, n - self.window)], -1)


@register
@dataclass(frozen=True)
class HeavyHitters(KVPolicy):
    """H2O (Zhang et al. 2023): the ``recent`` most recent keys and the ``heavy`` others with the largest
    accumulated attention (the sum of every weight they received, from every query of every call since they
    entered). ``of_budget`` splits the budget evenly, as the paper does."""

    name: ClassVar[str] = "h2o"
    observes: ClassVar[tuple[int | None, ...]] = (None,)
    accumulates: ClassVar[bool] = True
    heavy: int = 32
    recent: int = 32

    def __post_init__(self) -> None:
        if self.heavy < 0 or self.recent < 1:
            raise ValueError(f"H2O needs heavy >= 0 and recent >= 1, got heavy={self.heavy}, recent={self.recent}")

    @classmethod
    def of_budget(cls, budget: int | None = None) -> HeavyHitters:
        b = _check_budget(budget, 1, "h2o")
        recent = max(1, b - b // 2)
        return cls(b - recent, recent)

    @property
    def budget(self) -> int:
        return self.heavy + self.recent

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        now = seen.per_kv_head(seen.received())
        if previous is None:
            return now
        return F.pad(previous, (0, now.shape[-1] - previous.shape[-1])) + now  # new keys start from what they got now

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        if pos.shape[-1] <= self.budget:
            return None
        if score is None:
            raise ValueError("H2O keeps the keys with the largest accumulated attention: no score was recorded")
        return _heavy_and_recent(score, self.heavy, self.recent)


@register
@dataclass(frozen=True)
class SnapKV(KVPolicy):
    """SnapKV (Li et al. 2024): after the prompt, the ``budget - window`` earlier keys that the prompt's last
    ``window`` queries attend to most (their weights summed over those queries, then average-pooled over ``kernel``
    neighbouring keys), plus the last ``window`` keys. Generated keys are all kept."""

    name: ClassVar[str] = "snapkv"
    observes: ClassVar[tuple[int | None, ...]] = (32,)
    size: int = 64
    window: int = 32
    kernel: int = 7

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

    @classmethod
    def of_budget(cls, budget: int | None = None, *, window: int = 32, kernel: int = 7) -> SnapKV:
        return cls(_check_budget(budget, 1, "snapkv"), window, kernel)

    @property
    def budget(self) -> int:
        return self.size

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        if not prompt:
            return None  # chosen once, after the prompt
        return seen.per_kv_head(_pool(seen.received(last=self.window), self.kernel, self.window))

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        n = pos.shape[-1]
        if not prompt or n <= self.size:
            return None
        if score is None:
            raise ValueError("SnapKV selects by the prompt's last queries: no observation score was recorded")
        window = min(self.window, self.size)
        return _heavy_and_recent(score, self.size - window, window)


@dataclass(frozen=True)
class _KeepTop(KVPolicy):
    """After every call, the ``size`` keys of highest :meth:`score` (the policies that rank and cut, nothing else)."""

    size: int = 64

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"{self.name} keeps at least one key per head, got {self.size!r}")

    @classmethod
    def of_budget(cls, budget: int | None = None) -> _KeepTop:
        return cls(_check_budget(budget, 1, cls.name))

    @property
    def budget(self) -> int:
        return self.size

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        if pos.shape[-1] <= self.size:
            return None
        if score is None:
            raise ValueError(f"{self.name} ranks the keys by a score, and none was recorded")
        return _top(score, self.size)


@register
@dataclass(frozen=True)
class TOVA(_KeepTop):
    """TOVA (Oren et al. 2024, "Transformers are Multi-State RNNs"): after every call, the ``size`` keys the call's
    last query attends to most (its weights summed over the query heads that share the key/value head); the others
    are dropped. No recency or sink rule: the current query decides alone."""

    name: ClassVar[str] = "tova"
    observes: ClassVar[tuple[int | None, ...]] = (1,)

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        return seen.per_kv_head(seen.received(last=1))


@register
@dataclass(frozen=True)
class KeyNorm(_KeepTop):
    """Knorm (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression"): the
    ``size`` keys of smallest L2 norm (low-norm keys draw the most attention); no query is read, so it costs no
    attention scores. Rotary positions turn keys without changing their norms."""

    name: ClassVar[str] = "knorm"

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        return -seen.keys.float().norm(dim=-1)  # (B, G, N): the smaller the norm, the higher the rank


@register
@dataclass(frozen=True)
class PyramidKV(KVPolicy):
    """PyramidKV (Cai et al. 2024): SnapKV's selection with a budget per layer that falls linearly from the first
    layer to the last (attention funnels from broad to focused with depth), the same total as ``budget`` keys in
    every layer. As the paper's code: of the budget past the observation ``window``, the last layer keeps
    ``1 / beta`` and the first ``2 - 1 / beta`` times the mean, in equal steps. (The paper also caps the first
    layer at the prompt's length; here the budgets are fixed before the prompt is seen.)"""

    name: ClassVar[str] = "pyramidkv"
    observes: ClassVar[tuple[int | None, ...]] = (32,)
    size: int = 64
    beta: int = 20
    window: int = 32
    kernel: int = 7

    def __post_init__(self) -> None:
        SnapKV(self.size, self.window, self.kernel)  # the same checks
        if isinstance(self.beta, bool) or not isinstance(self.beta, int) or self.beta < 1:
            raise ValueError(
                f"PyramidKV's beta (first layer's share over the last's) is a whole number >= 1, got {self.beta!r}"
            )

    @classmethod
    def of_budget(cls, budget: int | None = None, *, beta: int = 20, window: int = 32, kernel: int = 7) -> PyramidKV:
        return cls(_check_budget(budget, 1, "pyramidkv"), beta, window, kernel)

    @property
    def budget(self) -> int:
        return self.size

    def layer_budget(self, layer: int, num_layers: int) -> int:
        """The keys per head layer ``layer`` of ``num_layers`` keeps."""
        extra = self.size - self.window
        if extra <= 0 or num_layers < 2:
            return self.size
        low = extra // self.beta
        high = 2 * extra - low
        step = (high - low) // (num_layers - 1)
        return self.window + high - layer * step

    def groups(self, layer: int, num_kv_heads: int, num_layers: int) -> list[tuple[list[int], KVPolicy]]:
        size = self.layer_budget(layer, max(num_layers, 1))
        return [(list(range(num_kv_heads)), SnapKV(size, self.window, self.kernel))]


@register
@dataclass(frozen=True)
class HeadAware(KVPolicy):
    """Every key for the key/value heads in ``full_heads[layer]``, the first ``sinks`` + the most recent
    ``budget - sinks`` for the others (DuoAttention, Xiao et al. 2024; RazorAttention, Tang et al. 2024); the split
    from :func:`multihead.interpret.kv.heads.classify` (``multihead heads MODEL --kv``)."""

    name: ClassVar[str] = "head-aware"
    needs_split: ClassVar[bool] = True
    keep_all: tuple[tuple[int, ...], ...] = ()
    streaming: SinksWindow = SinksWindow()

    @classmethod
    def of_budget(cls, budget: int | None = None, *, full_heads: Sequence[Sequence[int]] = (), sinks: int = 4):
        b = _check_budget(budget, sinks + 1, "head-aware")
        keep_all = split_heads(full_heads)
        if not keep_all:
            raise ValueError(
                "the head-aware policy needs the retrieval heads of every layer (full_heads=): run "
                "`multihead heads MODEL --kv --out DIR` and pass DIR/kv-heads.json"
            )
        return cls(tuple(tuple(h) for h in keep_all), SinksWindow(sinks, b - sinks))

    @property
    def layers(self) -> int:  # type: ignore[override]
        return len(self.keep_all)

    @property
    def budget(self) -> int:
        return self.streaming.budget

    def groups(self, layer: int, num_kv_heads: int, num_layers: int) -> list[tuple[list[int], KVPolicy]]:
        if layer >= len(self.keep_all):
            raise ValueError(
                f"the head-aware split names {len(self.keep_all)} layers; this model has more (layer {layer}): "
                "classify the heads of this model"
            )
        chosen = list(self.keep_all[layer])
        if any(h >= num_kv_heads for h in chosen):
            raise ValueError(
                f"the head-aware split names key/value heads {chosen} in layer {layer}, which has "
                f"{num_kv_heads}: classify the heads of this model"
            )
        rest = [h for h in range(num_kv_heads) if h not in chosen]
        return [(chosen, Full()), (rest, self.streaming)]


@register
@dataclass(frozen=True)
class Streaming(KVPolicy):
    """StreamingLLM as its paper runs it (Xiao et al. 2023, section 3.2): the first ``sinks`` tokens and the last
    ``window`` ones, each key rotated at its *slot in the cache* rather than its position in the text, so that a
    model trained on short rows reads a stream of any length
    (:class:`~multihead.modules.kv_cache.StreamingKV`). ``window`` keeps the same keys at their positions in the
    text instead, as the other policies do; after the first call, tokens come one at a time."""

    name: ClassVar[str] = "streaming"
    sinks: int = 4
    window: int = 60

    def __post_init__(self) -> None:
        SinksWindow(self.sinks, self.window)  # the same checks

    @classmethod
    def of_budget(cls, budget: int | None = None, *, sinks: int = 4) -> Streaming:
        b = _check_budget(budget, sinks + 1, "streaming")
        return cls(sinks, b - sinks)

    @property
    def budget(self) -> int:
        return self.sinks + self.window

    @classmethod
    def why_not(cls, where: str) -> str | None:
        if where == "attached":
            return (
                "the streaming policy rotates keys at their slot in the cache; an HF model rotates them before its "
                "cache sees them: stream an attached model with multihead.hf.stream.StreamCache (multihead stream), "
                "or keep the same keys at their positions with policy='window'"
            )
        if where == "recorded":
            return (
                "the streaming policy rotates keys at their slot in the cache, so it cannot be applied to a prompt "
                "read at its positions: decode under it (new_cache(policy='streaming')), or use policy='window'"
            )
        return None

    def layer_cache(self, layer: int, num_kv_heads: int, num_layers: int, window: int | None) -> LayerKV:
        if window is not None:
            raise ValueError(
                "the streaming policy cannot serve a model with sliding-window layers: their window is counted "
                "in cache slots; use policy='window' (the same keys at their positions) or the full cache"
            )
        return StreamingKV(self.sinks, self.window)


@register
@dataclass(frozen=True)
class AdaKV(KVPolicy):
    """Ada-KV (Feng et al. 2024, "Adaptive Budget Allocation for Efficient LLM Inference"): SnapKV's scores, but
    the layer's budget (``size`` x its key/value heads) is shared among its heads by one ranking over all of them,
    so a head whose attention is spread keeps more keys and a focused one fewer; every head keeps at least
    ``floor`` x ``size`` (kvpress's ``alpha_safeguard``) and SnapKV's observation window. Each key/value head is
    stored at its own length, so the evicted keys' memory is released (kvpress's AdaKVPress masks them and keeps
    them). In a batch, each head keeps the most keys any row gives it (each row its own best ones): at least every
    key Ada-KV keeps for that row. Chosen once, after the prompt; generated keys are all kept."""

    name: ClassVar[str] = "adakv"
    observes: ClassVar[tuple[int | None, ...]] = (32,)
    size: int = 64
    window: int = 32
    kernel: int = 7
    floor: float = 0.2

    def __post_init__(self) -> None:
        SnapKV(self.size, self.window, self.kernel)  # the same checks
        if isinstance(self.floor, bool) or not isinstance(self.floor, (int, float)) or not 0 <= self.floor <= 1:
            raise ValueError(
                f"Ada-KV's floor is the share of the budget every head keeps, in [0, 1]; got {self.floor!r}"
            )

    @classmethod
    def of_budget(cls, budget: int | None = None, *, window: int = 32, kernel: int = 7, floor: float = 0.2) -> AdaKV:
        return cls(_check_budget(budget, 1, "adakv"), window, kernel, floor)

    @property
    def budget(self) -> int:
        return self.size

    def groups(self, layer: int, num_kv_heads: int, num_layers: int) -> list[tuple[list[int], KVPolicy]]:
        # one group per key/value head: each keeps its own number of keys in buffers of its own length
        return [([h], SnapKV(self.size, self.window, self.kernel)) for h in range(num_kv_heads)]

    def share(self, scores: list[Tensor | None], *, prompt: bool) -> list[KVPolicy] | None:
        if not prompt or any(s is None for s in scores):
            return None
        score = torch.cat([s for s in scores if s is not None], 1).clone()  # (B, G, N)
        b, g, n = score.shape
        if n <= self.size:
            return None
        score[..., n - min(self.window, self.size) :] = torch.inf  # SnapKV's window stays in every head
        safe = int(self.size * self.floor)
        if safe:
            score.scatter_(-1, score.topk(safe, -1).indices, torch.inf)
        chosen = score.flatten(1).topk(g * self.size, -1).indices // n  # (B, G * size): the head of each kept key
        counts = F.one_hot(chosen, g).sum(1).amax(0)  # (G,): the most keys any row keeps in each head
        return [SnapKV(int(c), min(self.window, int(c)), self.kernel) for c in counts]


@register
@dataclass(frozen=True)
class ExpectedAttention(KVPolicy):
    """Expected attention (kvpress's own method, Devoto et al. 2025, "Expected Attention: KV Cache Compression by
    Estimating Attention from Future Queries Distribution"): the queries to come are modelled as a Gaussian with the
    mean and covariance of the prompt's queries before rotation (its first ``sinks`` left out), turned by the
    average rotation of the next ``future`` positions; a key's score is the attention that Gaussian pays it in
    expectation, ``softmax(k . mu / sqrt(d) + k' S k / 2d)``, averaged over the query heads that share it and
    weighed by its value's norm. The first ``sinks`` keys are always kept. Chosen once, after the prompt; generated
    keys are all kept."""

    name: ClassVar[str] = "expected"
    observes: ClassVar[tuple] = (("queries", 4),)
    size: int = 64
    future: int = 512
    sinks: int = 4

    def __post_init__(self) -> None:
        for what, v, least in (("budget", self.size, 1), ("future", self.future, 1), ("sinks", self.sinks, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"expected attention's {what} is a whole number >= {least}, got {v!r}")

    @classmethod
    def of_budget(cls, budget: int | None = None, *, future: int = 512, sinks: int = 4) -> ExpectedAttention:
        return cls(_check_budget(budget, sinks + 1, "expected"), future, sinks)

    @property
    def budget(self) -> int:
        return self.size

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        if not prompt:
            return None
        mu, cov = seen.queries(self.sinks)  # (B, H, D), (B, H, D, D) before rotation
        if isinstance(seen.rope, Tensor):  # the average rotation of the positions to come
            start = float(seen.next_position or 0)
            angles = torch.arange(start, start + self.future, device=mu.device)[:, None] * seen.rope.to(mu.device)
            cos, sin = angles.cos().mean(0), angles.sin().mean(0)
            mu = _rotate(mu, cos, sin)
            cov = _rotate(_rotate(cov, cos, sin).transpose(-1, -2), cos, sin).transpose(-1, -2)
        k = seen.keys.float()  # (B, G, N, D)
        g, d = k.shape[1], k.shape[-1]
        kh = k.repeat_interleave(mu.shape[1] // g, 1)  # (B, H, N, D)
        logits = (kh @ mu[..., None]).squeeze(-1) / d**0.5 + torch.einsum("bhni,bhij,bhnj->bhn", kh, cov, kh) / (2 * d)
        n = k.shape[2]
        s = self.sinks if n > self.sinks else 0
        score = torch.zeros_like(logits)
        score[..., s:] = logits[..., s:].softmax(-1)
        score = seen.per_kv_head(score) / (mu.shape[1] // g)  # the mean over the group
        if seen.values is not None:
            score = score * seen.values.float().norm(dim=-1)
        score[..., :s] = torch.inf  # the sinks stay
        return score

    def keep(self, pos: Tensor, score: Tensor | None, *, prompt: bool) -> Tensor | None:
        if not prompt or pos.shape[-1] <= self.size:
            return None
        if score is None:
            raise ValueError("expected attention ranks the prompt's keys by a score, and none was recorded")
        return _top(score, self.size)


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


def head_aware_at(
    fraction: float, length: int, full_heads: Sequence[Sequence[int]], num_kv_heads: Sequence[int]
) -> KVPolicy:
    """The head-aware policy that keeps about ``fraction`` of a ``length``-token prompt's key/value bytes: the key/value
    heads ``full_heads`` (per layer, e.g. :func:`multihead.interpret.kv.heads.read_split` of a ``kv-heads.json``)
    keep every key, and the others a window sized so that the two together hold ``fraction`` of the full cache
    (``num_kv_heads``: key/value heads per layer); the window keeps at least 5 keys (4 sinks and the latest), so a
    split whose whole heads alone hold the fraction gets that floor. Refused where the whole heads alone hold more
    than ``fraction``."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if length < 1:
        raise ValueError(f"length must be a positive number of tokens, got {length}")
    if len(full_heads) != len(num_kv_heads):
        raise ValueError(f"full_heads names {len(full_heads)} layers; the model has {len(num_kv_heads)}")
    whole = sum(len(h) for h in full_heads) / sum(num_kv_heads)  # the whole heads' share of the heads
    if whole > fraction:
        raise ValueError(
            f"the heads kept whole are {whole:.0%} of the key/value heads, more than the {fraction:.0%} asked for; "
            "keep fewer whole (a smaller split) or ask for more"
        )
    window = max(5, round(length * (fraction - whole) / (1 - whole)))
    return make_policy("head-aware", window, full_heads=[list(h) for h in full_heads])


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


def recorded_windows() -> tuple:
    """What a recorded prompt keeps, so that every registered policy can be applied to it afterwards: the query
    windows it sums the received attention over (an int or None, every query) and the query statistics
    (``("queries", skip)``) the policies observe (:meth:`Observed.observe`)."""
    return tuple(dict.fromkeys(w for cls in KV_POLICIES.values() for w in (None, *cls.observes)))


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


def _turn(x: Tensor, rope: Tensor, positions: Tensor) -> Tensor:
    """``x`` ``(..., N, D)`` turned by ``positions`` (broadcast to ``(..., N)``, any sign) at the rotary
    frequencies ``rope`` ``(R,)``: the first ``2R`` dims in the "rotate half" layout (HF Llama, GPT-NeoX), the rest
    untouched (partial rotary)."""
    angles = positions[..., None] * rope.to(x.device, torch.float32)  # (..., N, R)
    return _rotate(x, angles.cos(), angles.sin())


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` with its pairs ``(i, i + R)`` turned by the angles whose cosines and sines are ``cos``, ``sin``
    ``(..., R)`` (averages of rotations are allowed: the map stays linear)."""
    r = cos.shape[-1]
    x1, x2, rest = x[..., :r], x[..., r : 2 * r], x[..., 2 * r :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)


def _per_kv_head(score: Tensor, g: int) -> Tensor:
    """``(B, H, N)`` query-head scores summed over each key/value head's group: ``(B, G, N)``."""
    b, h, n = score.shape
    return score.view(b, g, h // g, n).sum(2)


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

    def nbytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for t in (self.pos, self.score) if t is not None)
        return self.buffers.nbytes() + extra


class PolicyKV(LayerKV):
    """One self-attention layer's cache under a :class:`KVPolicy`: its key/value heads in groups, each with its own
    buffers and rule. It speaks the cache protocol of :class:`~multihead.modules.kv_cache.LayerKV`:
    :meth:`update` appends and answers one view per group (the module attends each), :meth:`done` scores and
    evicts.

    ``window``: the layer's sliding window (its keys past it are dropped). ``record``: keep every key and the
    prompt's attention sums (:func:`recorded_windows`) so that :meth:`KVCache.compress` can apply any policy
    afterwards."""

    def __init__(
        self,
        groups: list[tuple[list[int], KVPolicy]],
        *,
        window: int | None = None,
        record: bool = False,
        policy: KVPolicy | None = None,
        rope: Tensor | None | bool = None,
        prompt_only: bool = False,
    ):
        super().__init__()
        self.spec, self.window, self.record, self.policy = groups, window, record, policy
        self.prompt_only = prompt_only
        # the rotary frequencies the keys are turned with (None: not rotated; False: unknown); a native model's
        # rotary module tells them at the first call, an HF model's cache is told when it is made
        self.rope = rope
        self.groups: list[_Group] | None = None
        self.seen = 0
        self.recorded: dict[int | None, Tensor] = {}  # the prompt's sums per query window (record=True)
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
            rules: list = [SinksWindow(0, max(self.window - 1, 1))] * len(groups)
        elif self.record or (self.prompt_only and not prompt):
            return
        else:
            shared = None if self.policy is None else self.policy.share([g.score for g, _ in groups], prompt=prompt)
            rules = shared or [g.rule for g, _ in groups]
        for (grp, kpos), rule in zip(groups, rules):
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
            self.recorded = {key: seen.observe(key) for key in recorded_windows()}
            return
        grp.observe(seen, prompt=prompt)


def policy_cache(
    policy: KVPolicy,
    num_kv_heads: Sequence[int],
    windows: Sequence[int | None],
    *,
    record: bool = False,
    prompt_only: bool = False,
):
    """A :class:`~multihead.modules.kv_cache.KVCache` whose self-attention layers follow ``policy``:
    ``num_kv_heads[i]`` and ``windows[i]`` (the sliding window, None for a global layer) per layer. Under ``full``
    the global layers get the plain :class:`LayerKV` (bit-identical to a cache made without a policy). ``record``:
    every key is kept and the prompt's scores are recorded, so that :meth:`KVCache.compress` can apply any policy
    (and budget) to one prefill. ``prompt_only``: the policy evicts once, after the prompt (:class:`PolicyKV`)."""
    from .kv_cache import KVCache

    policy.check(num_kv_heads)
    if record and policy.why_not("recorded"):
        raise ValueError(policy.why_not("recorded"))
    layers: list[LayerKV] = []
    for i, (g, w) in enumerate(zip(num_kv_heads, windows)):
        if record:
            layers.append(PolicyKV([(list(range(g)), Full())], window=w, record=True))
        else:
            layers.append(policy.layer_cache(i, g, len(num_kv_heads), w))
            if prompt_only and isinstance(layers[-1], PolicyKV):
                layers[-1].prompt_only = True
    return KVCache(len(layers), self_attn=layers, policy=policy)


def compress(cache, policy: KVPolicy, *, prompt_only: bool = False):
    """A new cache holding what ``policy`` would have kept had the prompt been read under it: ``cache`` is a
    recorded one (:func:`policy_cache` with ``record=True``) after the prompt. Bit-identical to a prefill under
    ``policy`` (the scores are the same numbers); ``cache`` itself is left as it was, so one prefill serves every
    policy and budget. ``prompt_only``: the new cache keeps every token that follows (the policy evicted once, after
    the prompt, as kvpress's presses do); by default it keeps evicting to the budget at every step."""
    from .kv_cache import KVCache

    policy.check_layers(len(cache.self_attn))
    if policy.why_not("recorded"):
        raise ValueError(policy.why_not("recorded"))
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
        new = PolicyKV(
            policy.rules(i, k.shape[1], len(cache.self_attn)), window=rec.window, policy=policy, prompt_only=prompt_only
        )
        new.groups, new.seen, new.rope = [], rec.seen, rec.rope
        h = len(whole.q_heads)
        for heads, rule in new.spec:
            grp = _Group(heads, rule, h // k.shape[1])
            sel = torch.tensor(heads, device=k.device)
            every = heads == list(range(k.shape[1]))  # one group of every head: the recording's own tensors, no copy
            # (safe: an append past a stored buffer reallocates, and eviction gathers into new buffers)
            kg = k if every else k.index_select(1, sel)
            grp.buffers.store(kg, v if every else v.index_select(1, sel))
            grp.pos = pos if every else pos.index_select(1, sel)
            if rec.window is None:  # the group's query heads' recorded sums, as a prefill under the policy sees them
                q_sel = torch.tensor(grp.q_heads, device=k.device)
                sums = {w: t if every else _heads(t, q_sel) for w, t in rec.recorded.items()}
                vg = v if every else v.index_select(1, sel)
                grp.observe(Observed(kg, recorded=sums, values=vg, rope=rec.rope, next_position=rec.seen), prompt=True)
            new.groups.append(grp)
        new._cut([(grp, grp.pos) for grp in new.groups if grp.pos is not None], prompt=True)
        layers.append(new)
    out = KVCache(len(layers), self_attn=layers, policy=policy)
    out.key_padding, out.next_position = cache.key_padding, cache.next_position
    return out


def _heads(recorded, q_heads: Tensor):
    """A recorded prompt's sums (or query statistics: a tuple) for the query heads ``q_heads`` only."""
    if isinstance(recorded, tuple):
        return tuple(t.index_select(1, q_heads) for t in recorded)
    return recorded.index_select(1, q_heads)


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
    "AdaKV",
    "ExpectedAttention",
    "Full",
    "KeyNorm",
    "Observed",
    "PyramidKV",
    "TOVA",
    "register",
    "HeavyHitters",
    "KVPolicy",
    "KV_POLICIES",
    "PolicyKV",
    "Rule",
    "SinksWindow",
    "SnapKV",
    "Streaming",
    "compress",
    "make_policy",
    "split_heads",
    "policy_cache",
    "received_attention",
]
