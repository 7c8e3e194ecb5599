"""The KV policies, one class each, registered by name (:func:`~multihead.modules.kv.registry.register`): which
cached keys each key/value head keeps.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads (of one group), ``N`` kept positions, ``D`` head
dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .cache import LayerKV, StreamingKV
from .layer import LayerCache
from .observe import Observed, _arange, _rotate
from .policy import KV_POLICIES, KVPolicy, ObservesWindow, _check_budget, make_policy, register


def _top(score: Tensor, n: int) -> Tensor:
    """Slots ``(B, G, n)`` with the largest ``score``, in position order."""
    return score.topk(n, dim=-1).indices.sort(-1).values


def _heavy_and_recent(score: Tensor, heavy: int, recent: int) -> Tensor:
    """Slots ``(B, G, heavy + recent)``: the ``recent`` last ones and, among the others, the ``heavy`` with the
    largest ``score``, all in position order."""
    n = score.shape[-1]
    return torch.cat([_top(score[..., : n - recent], heavy), _arange(recent, score, n - recent)], -1)


@register
@dataclass(frozen=True)
class Full(KVPolicy):
    """Every key: the plain cache (bit-identical to :class:`~multihead.modules.kv.LayerKV`). It has no
    budget: one given is refused rather than ignored."""

    name: ClassVar[str] = "full"
    budgeted: ClassVar[bool] = False
    full: ClassVar[bool] = True

    def layer_cache(self, layer: int, num_kv_heads: int, num_layers: int, window: int | None) -> LayerCache:
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
    observes = ObservesWindow()
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
class LayerTOVA(TOVA):
    """TOVA as its authors' code and kvpress's ``TOVAPress`` score: the call's last query's weights averaged over
    every query head of the layer, so that all its key/value heads keep the same ``size`` keys."""

    name: ClassVar[str] = "tova-layer"

    def score(self, seen: Observed, previous: Tensor | None, *, prompt: bool) -> Tensor | None:
        mean = seen.received(last=1).mean(1, keepdim=True)  # (B, 1, N): every query head alike
        return mean.expand(-1, seen.keys.shape[1], -1)


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
    observes = ObservesWindow()
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
    (:class:`~multihead.modules.kv.StreamingKV`). ``window`` keeps the same keys at their positions in the
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

    def layer_cache(self, layer: int, num_kv_heads: int, num_layers: int, window: int | None) -> LayerCache:
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
    observes = ObservesWindow()
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


def head_aware_at(
    fraction: float,
    length: int,
    full_heads: Sequence[Sequence[int]],
    num_kv_heads: Sequence[int],
    *,
    at_most: bool = False,
) -> KVPolicy:
    """The head-aware policy that keeps about ``fraction`` of a ``length``-token prompt's key/value bytes: the key/value
    heads ``full_heads`` (per layer, e.g. :func:`multihead.interpret.kv.heads.read_split` of a ``kv-heads.json``)
    keep every key, and the others a window sized so that the two together hold ``fraction`` of the full cache
    (``num_kv_heads``: key/value heads per layer); the window keeps at least 5 keys (4 sinks and the latest), so a
    split whose whole heads alone hold the fraction gets that floor. The window's length is rounded to the nearest
    key, or with ``at_most`` down, so that the policy never holds more than ``fraction`` of the keys (above the
    floor). Refused where the whole heads alone hold more than ``fraction``."""
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
    exact = length * (fraction - whole) / (1 - whole)
    window = max(5, math.floor(exact + 1e-9) if at_most else round(exact))  # 1e-9: a whole number computed inexactly
    return make_policy("head-aware", window, full_heads=[list(h) for h in full_heads])


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
