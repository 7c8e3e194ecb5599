"""The attention-sink findings of 2025-2026, measured on a causal LM through :mod:`.measure`.

* ``sink-length`` (Barbero et al. 2025, arXiv 2504.02732): the first token's share of attention, layer by layer, at
  several context lengths; and the loss when that share is taken away at inference (the sink removed).
* ``sink-valley`` (Queipo-de-Llano et al. 2025, arXiv 2510.06477): per layer, the first token's hidden norm over
  the others', the sink rate and the matrix entropy: do the spike, the sink and the entropy valley share layers?
  Then the massive activation ablated (its dimensions set to the other tokens' mean where it first appears): what
  happens to the sink and the valley?
* ``massive-origin`` (arXiv 2605.08504 and 2605.06611): the layer where the massive activation first appears, how
  much of it the feed-forward writes there, the few neurons that write most of it ("super neurons"), and what
  editing them does: zeroed on the first token (does the sink vanish, against as many other neurons zeroed?), and
  moved onto a later token (does the sink follow them?).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor

from ...modules.anatomy import anatomy
from .measure import Pass, measure, neuron_activations, stream, why_no_neurons, without_sink

MASSIVE_RATIO = 10.0  # a block's output carries a massive activation where the first token's norm is this many times
# the median of the others'
DIM_RATIO = 20.0  # a dimension carries it where the first token's magnitude there is this many times the median
# magnitude of the stream


def mean_pass(model, rows: Tensor, **options) -> Pass:
    """:func:`~.measure.measure` row by row (the memory of one row's maps at a time), averaged."""
    passes = [measure(model, rows[i : i + 1], **options) for i in range(rows.shape[0])]
    out = Pass()
    for name, value in passes[0].as_dict().items():
        if isinstance(value, float):
            setattr(out, name, sum(getattr(p, name) for p in passes) / len(passes))
        else:
            setattr(out, name, torch.tensor([getattr(p, name) for p in passes]).mean(0).tolist())
    return out


def ratios(p: Pass) -> list[float]:
    return [f / max(r, 1e-12) for f, r in zip(p.norm_first, p.norm_rest)]


# ------------------------------------------------------------------------------------------------- sink-length
@torch.no_grad()
def needle_hits(model, needles: list, *, remove_sink: bool = False) -> float:
    """The share of needle prompts (:class:`~multihead.data.needles.Needle`) whose answer the model writes, every
    token of it (teacher-forced argmax: what greedy decoding writes), with or without the first token's attention."""
    a = anatomy(model)
    hits = 0
    for n in needles:
        ids = torch.tensor([n.ids + n.answer[:-1]])
        with without_sink(model) if remove_sink else contextlib.nullcontext():
            logits = a.logits(ids)
        start = len(n.ids) - 1
        hits += int(logits[0, start : start + len(n.answer)].argmax(-1).tolist() == list(n.answer))
    return hits / max(1, len(needles))


def sink_length(
    model, rows_at: Callable[[int], Tensor], lengths: list[int], progress=None, needles_at: Callable | None = None
) -> dict:
    """The first token's share per layer at each length, the loss with and without it (``rows_at(length)``:
    held-out rows of that many tokens), and with ``needles_at(length)`` (needle prompts of that length) the share of
    needles retrieved with and without it."""
    out: dict = {"lengths": {}}
    for length in lengths:
        rows = rows_at(length)
        kept = mean_pass(model, rows)
        removed = mean_pass(model, rows, remove_sink=True)
        out["lengths"][str(length)] = {
            "share": kept.share,
            "second": kept.second,
            "uniform": kept.uniform,
            "mean_share": sum(kept.share) / len(kept.share),
            "sink_rate": kept.sink_rate,
            "loss": kept.loss,
            "loss_without_sink": removed.loss,
        }
        if needles_at is not None:
            needles = needles_at(length)
            out["lengths"][str(length)]["needles"] = {
                "count": len(needles),
                "retrieved": needle_hits(model, needles),
                "retrieved_without_sink": needle_hits(model, needles, remove_sink=True),
            }
        if progress is not None:
            progress.update(1)
    first, last = (out["lengths"][str(n)] for n in (lengths[0], lengths[-1]))
    grows = last["mean_share"] > first["mean_share"]
    cost = [out["lengths"][str(n)]["loss_without_sink"] - out["lengths"][str(n)]["loss"] for n in lengths]
    out["verdict"] = (
        f"the first token's attention share (mean over layers) is {first['mean_share']:.2f} at {lengths[0]:,} tokens "
        f"and {last['mean_share']:.2f} at {lengths[-1]:,} ({'grows' if grows else 'does not grow'} with the length); "
        f"removing it raises the loss by {cost[0]:+.3f} nats at {lengths[0]:,} and {cost[-1]:+.3f} at "
        f"{lengths[-1]:,} ({'more' if cost[-1] > cost[0] else 'not more'} at the longer context)"
    )
    hurt = cost[-1] > cost[0] > 0
    if needles_at is not None:
        lost = [
            out["lengths"][str(n)]["needles"]["retrieved"] - out["lengths"][str(n)]["needles"]["retrieved_without_sink"]
            for n in lengths
        ]
        got = [out["lengths"][str(n)]["needles"] for n in (lengths[0], lengths[-1])]
        out["verdict"] += (
            f"; needles retrieved {got[0]['retrieved']:.2f} -> {got[0]['retrieved_without_sink']:.2f} without it at "
            f"{lengths[0]:,} tokens, {got[1]['retrieved']:.2f} -> {got[1]['retrieved_without_sink']:.2f} at "
            f"{lengths[-1]:,}"
        )
        hurt = lost[-1] > lost[0] or (lost[-1] == lost[0] > 0 and cost[-1] > cost[0])
    out["reproduced"] = bool(grows and hurt)
    return out


# ------------------------------------------------------------------------------------------------- sink-valley
def origin(p: Pass, ratio: float = MASSIVE_RATIO) -> int | None:
    """The first block whose output carries a massive activation on the first token (None: none does)."""
    return next((j for j, r in enumerate(ratios(p)) if r >= ratio), None)


SPIKES = ("first", "largest")


def spike_origin(p: Pass, spike: str = "first", ratio: float = MASSIVE_RATIO) -> int | None:
    """Where the massive activation to explain appears: ``first``, the first block with a ``ratio``x first-token
    norm (:func:`origin`); ``largest``, the first block within a factor 10 of the largest ratio (a later, larger
    spike that a first, smaller one precedes). None: no block reaches ``ratio``."""
    if spike not in SPIKES:
        raise ValueError(f"spike is one of {', '.join(SPIKES)}, not {spike!r}")
    r = ratios(p)
    if spike == "first" or max(r) < ratio:
        return origin(p, ratio)
    return next(j for j, v in enumerate(r) if v >= max(ratio, max(r) / 10))


def massive_dims(
    model, rows: Tensor, block: int, ratio: float = DIM_RATIO, streamed: Tensor | None = None
) -> list[int]:
    """The dimensions of the first token's stream after ``block`` whose magnitude is ``ratio`` times the stream's
    median magnitude (averaged over the rows), largest first (``streamed``: that stream, already read)."""
    h = (stream(model, rows)[block] if streamed is None else streamed).abs()  # (B, L, E)
    first = h[:, 0].mean(0)
    median = h.flatten().median()
    dims = (first >= ratio * median).nonzero().flatten()
    return dims[first[dims].argsort(descending=True)].tolist()


def ablate_dims(dims: list[int]) -> Callable[[Tensor], Tensor]:
    """An edit of a stream ``(B, L, E)``: the first token's ``dims`` set to the other tokens' mean there."""

    def edit(x: Tensor) -> Tensor:
        x = x.clone()
        x[:, 0, dims] = x[:, 1:, dims].mean(1)
        return x

    return edit


def layers_where(values: list[float], test: Callable[[float], bool]) -> list[int]:
    return [i for i, v in enumerate(values) if test(v)]


def valley(entropy: list[float]) -> list[int]:
    """The layers in the entropy valley: within a tenth of the entropy's range above its minimum."""
    low, high = min(entropy), max(entropy)
    return layers_where(entropy, lambda e: e <= low + 0.1 * (high - low))


def sink_valley(model, rows: Tensor, *, ratio: float = MASSIVE_RATIO, dim_ratio: float = DIM_RATIO) -> dict:
    """Spike, sink and valley per layer, and the massive activation ablated where it appears."""
    base = mean_pass(model, rows)
    r = ratios(base)
    spike = layers_where(r, lambda x: x >= ratio)
    sink = layers_where(base.sink_rate, lambda x: x >= 0.5)
    low = valley(base.entropy)
    out: dict = {
        "before": {**base.as_dict(), "norm_ratio": r},
        "spike_layers": spike,
        "sink_layers": sink,
        "valley_layers": low,
    }
    start = origin(base, ratio)
    if start is None:
        out["verdict"] = (
            f"no layer's first token has a norm {ratio:g}x the others' (the largest ratio is {max(r):.1f}x): no "
            "massive activation to ablate"
        )
        out["reproduced"] = False
        return out
    dims = massive_dims(model, rows, start, dim_ratio)
    after = mean_pass(model, rows, edits={start: ablate_dims(dims)})
    out.update(origin=start, dims=dims, after={**after.as_dict(), "norm_ratio": ratios(after)})
    late = [j for j in range(start + 1, len(base.share))] or [start]
    before_rate = sum(base.sink_rate[j] for j in late) / len(late)
    after_rate = sum(after.sink_rate[j] for j in late) / len(late)
    shared = sorted(set(spike) & set(sink) & set(low))
    out["verdict"] = (
        f"the first token's norm is >= {ratio:g}x the others' in {len(spike)} of {len(r)} layers (from layer {start}), "
        f"the sink rate >= 0.5 in {len(sink)}, the entropy valley spans {len(low)} (layers {_span(low)}); all three "
        f"in {len(shared)}. Ablating the {len(dims)} massive dimensions at layer {start}: the sink rate after it "
        f"{before_rate:.2f} -> {after_rate:.2f}, the mean entropy {_mean(base.entropy):.3f} -> "
        f"{_mean(after.entropy):.3f}"
    )
    out["reproduced"] = bool(shared) and after_rate < before_rate and _mean(after.entropy) > _mean(base.entropy)
    return out


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def _span(layers: list[int]) -> str:
    return "none" if not layers else f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])


# ---------------------------------------------------------------------------------------------- massive-origin
def super_neurons(
    model, rows: Tensor, block: int, dims: list[int], k: int, streamed: Tensor | None = None
) -> tuple[list[int], list[float], float]:
    """The ``k`` neurons of ``block``'s feed-forward that write most toward the first token's massive dimensions
    (each neuron's activation times its output weights there, along the dimensions' signs), their contributions,
    and the share of the feed-forward's whole contribution they make (``streamed``: the stream after ``block``,
    already read)."""
    a = anatomy(model)
    w = a.blocks[block].mlp_out.weight.detach()  # (E, N)
    act = neuron_activations(model, rows, block)[:, 0].mean(0)  # (N,): the first token's, over the rows
    h = stream(model, rows)[block] if streamed is None else streamed
    sign = h[:, 0, dims].mean(0).sign()  # (dims,)
    contrib = act * (sign[:, None] * w[dims]).sum(0)  # (N,)
    top = contrib.argsort(descending=True)[:k]
    total = contrib.sum()
    return top.tolist(), contrib[top].tolist(), float(contrib[top].sum() / total) if total > 0 else 0.0


def zero_neurons(neurons: list[int], at: int = 0) -> Callable[[Tensor], Tensor]:
    def edit(x: Tensor) -> Tensor:
        x = x.clone()
        x[:, at, neurons] = 0
        return x

    return edit


def move_neurons(neurons: list[int], to: int) -> Callable[[Tensor], Tensor]:
    """The first token's activations of ``neurons`` given to position ``to``, and taken from the first token."""

    def edit(x: Tensor) -> Tensor:
        x = x.clone()
        x[:, to, neurons] = x[:, 0, neurons]
        x[:, 0, neurons] = 0
        return x

    return edit


def massive_origin(
    model, rows: Tensor, *, k: int = 5, ratio: float = MASSIVE_RATIO, seed: int = 0, spike: str = "first"
) -> dict:
    """The origin layer of the ``spike`` asked for (:func:`spike_origin`), the super neurons, and the sink after
    editing them (zeroed; moved to a later token)."""
    a = anatomy(model)
    base = mean_pass(model, rows)
    start = spike_origin(base, spike, ratio)
    out: dict = {"before": {**base.as_dict(), "norm_ratio": ratios(base)}, "k": k, "spike": spike}
    if start is None:
        out["verdict"] = (
            f"no layer's first token has a norm {ratio:g}x the others' (the largest is {max(ratios(base)):.1f}x): "
            "no massive activation whose origin to find"
        )
        out["reproduced"] = False
        return out
    if a.blocks[start].mlp_out is None:
        raise ValueError(f"{a.blocks[start].name}: {why_no_neurons(a, start)}")
    after = stream(model, rows)[start]  # read once for the dimensions and the neurons
    dims = massive_dims(model, rows, start, streamed=after)
    neurons, contrib, share = super_neurons(model, rows, start, dims, k, streamed=after)
    n = a.blocks[start].mlp_out.weight.shape[1]
    g = torch.Generator().manual_seed(seed)
    others = [int(i) for i in torch.randperm(n, generator=g).tolist() if i not in neurons][:k]
    zeroed = mean_pass(model, rows, edits={("neurons", start): zero_neurons(neurons)})
    control = mean_pass(model, rows, edits={("neurons", start): zero_neurons(others)})
    to = rows.shape[1] // 2
    moved = mean_pass(model, rows, edits={("neurons", start): move_neurons(neurons, to)}, key=to)
    stays = mean_pass(model, rows, key=to)  # the same position without the edit: its share before
    late = list(range(start + 1, len(base.share))) or [start]
    mean = lambda v: sum(v[j] for j in late) / len(late)  # noqa: E731
    out.update(
        origin=start,
        dims=dims,
        neurons=neurons,
        contributions=contrib,
        neuron_share=share,
        control_neurons=others,
        zeroed={**zeroed.as_dict(), "norm_ratio": ratios(zeroed)},
        control={**control.as_dict(), "norm_ratio": ratios(control)},
        moved_to=to,
        moved={**moved.as_dict(), "norm_ratio": ratios(moved)},
        unmoved=stays.as_dict(),
    )
    vanish = mean(zeroed.share) < 0.5 * mean(base.share) and mean(control.share) > 0.8 * mean(base.share)
    follows = mean(moved.share) > 2 * mean(stays.share)
    out["verdict"] = (
        f"the {'largest ' if spike == 'largest' else ''}massive activation first appears after layer {start} ({ratios(base)[start]:.0f}x the other tokens' "
        f"norm) in {len(dims)} dimension(s); {k} feed-forward neurons write {share:.0%} of what that layer's "
        f"feed-forward adds there. Zeroing them on the first token: its attention share after layer {start} "
        f"{mean(base.share):.2f} -> {mean(zeroed.share):.2f} ({k} other neurons zeroed: {mean(control.share):.2f}); "
        f"moving them to position {to}: that position's share {mean(stays.share):.3f} -> {mean(moved.share):.3f}"
    )
    out["reproduced"] = bool(vanish and follows)
    return out


__all__ = [
    "DIM_RATIO",
    "MASSIVE_RATIO",
    "ablate_dims",
    "massive_dims",
    "massive_origin",
    "mean_pass",
    "move_neurons",
    "needle_hits",
    "origin",
    "sink_length",
    "SPIKES",
    "sink_valley",
    "spike_origin",
    "super_neurons",
    "zero_neurons",
]
