"""The findings multihead measures, each registered once with its claim and figure."""

from __future__ import annotations

from pathlib import Path

from . import sinks as S
from .registry import Finding, register


def _figure(panels: int):
    from ...plotting import pyplot

    plt = pyplot()
    return plt.subplots(1, panels, figsize=(5.2 * panels, 4))


def _save(fig, path: Path) -> None:
    from ...plotting import save

    fig.tight_layout()
    save(fig, path)


# ------------------------------------------------------------------------------------------------- sink-length
def _run_length(model, rows_at, options: dict, progress) -> dict:
    return S.sink_length(model, rows_at, options["lengths"], progress)


def _plot_length(payload: dict, path: Path) -> None:
    fig, (a, b) = _figure(2)
    lengths = [int(n) for n in payload["lengths"]]
    for n in lengths:
        r = payload["lengths"][str(n)]
        a.plot(r["share"], marker=".", label=f"{n:,} tokens")
    a.set_xlabel("layer")
    a.set_ylabel("attention on the first token (mean over heads, queries)")
    a.set_title("sink strength per layer")
    a.legend()
    kept = [payload["lengths"][str(n)]["loss"] for n in lengths]
    removed = [payload["lengths"][str(n)]["loss_without_sink"] for n in lengths]
    b.plot(lengths, kept, marker="o", label="as it is")
    b.plot(lengths, removed, marker="o", label="first token's attention removed")
    b.set_xscale("log", base=2)
    b.set_xlabel("context length (tokens)")
    b.set_ylabel("next-token loss (nats)")
    b.set_title("the cost of removing the sink")
    b.legend()
    _save(fig, path)


register(
    Finding(
        "sink-length",
        "Barbero et al. 2025, Why do LLMs attend to the first token? (arXiv 2504.02732)",
        "the sink grows stronger as the context grows longer, and removing the first-token sink at inference hurts "
        "long-context performance",
        "the first token's attention share per layer (mean over heads and queries) on held-out text at each length, "
        "beside the second token's and what uniform attention would give it; and the next-token loss with the "
        "first token's attention taken from every later query (the rest renormalised)",
        _run_length,
        lambda options: len(options["lengths"]),
        lambda options: options["lengths"],
        _plot_length,
    )
)


# ------------------------------------------------------------------------------------------------- sink-valley
def _run_valley(model, rows_at, options: dict, progress) -> dict:
    out = S.sink_valley(model, rows_at(options["length"]))
    if progress is not None:
        progress.update(1)
    return out


def _plot_layers(ax, runs: dict, field: str, ylabel: str, log: bool = False) -> None:
    for label, r in runs.items():
        if r is not None:
            ax.plot(r[field], marker=".", label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend()


def _plot_valley(payload: dict, path: Path) -> None:
    fig, axes = _figure(3)
    runs = {"as it is": payload["before"], "massive dims ablated": payload.get("after")}
    _plot_layers(axes[0], runs, "norm_ratio", "first token's norm / the others' median", log=True)
    axes[0].set_title("the spike")
    _plot_layers(axes[1], runs, "sink_rate", "share of heads with first-token attention >= 0.3")
    axes[1].set_title("the sink")
    _plot_layers(axes[2], runs, "entropy", "matrix entropy (normalised)")
    axes[2].set_title("the compression valley")
    _save(fig, path)


register(
    Finding(
        "sink-valley",
        "Queipo-de-Llano et al. 2025, Attention Sinks and Compression Valleys in LLMs are Two Sides of the Same Coin "
        "(arXiv 2510.06477)",
        "the first token's hidden norm spikes, the representation's matrix entropy drops and the sink rate goes to "
        "about 1 in the same layers; ablating the massive activation removes both the sink and the valley",
        "per layer on held-out text: the first token's hidden norm over the median of the others', the sink rate "
        "(share of heads putting >= 0.3 of their attention on the first token) and the matrix entropy of the "
        "residual stream; then the dimensions carrying the massive activation, where it first appears, set to the "
        "other tokens' mean there, and all three measured again",
        _run_valley,
        lambda options: 1,
        lambda options: [options["length"]],
        _plot_valley,
    )
)


# ---------------------------------------------------------------------------------------------- massive-origin
def _run_origin(model, rows_at, options: dict, progress) -> dict:
    out = S.massive_origin(model, rows_at(options["length"]), k=options["neurons"])
    if progress is not None:
        progress.update(1)
    return out


def _plot_origin(payload: dict, path: Path) -> None:
    fig, axes = _figure(3)
    runs = {
        "as it is": payload["before"],
        f"top {payload['k']} neurons zeroed": payload.get("zeroed"),
        f"{payload['k']} other neurons zeroed": payload.get("control"),
    }
    _plot_layers(axes[0], runs, "norm_ratio", "first token's norm / the others' median", log=True)
    axes[0].set_title("the massive activation")
    _plot_layers(axes[1], runs, "share", "attention on the first token")
    axes[1].set_title("the sink")
    if payload.get("moved") is not None:
        moved = {"before": payload["unmoved"], "neurons moved there": payload["moved"]}
        _plot_layers(axes[2], moved, "share", f"attention on position {payload['moved_to']}")
        axes[2].set_title("the sink follows the neurons?")
    _save(fig, path)


register(
    Finding(
        "massive-origin",
        "A Single Layer to Explain Them All (arXiv 2605.08504); The Structural Origin of Attention Sink "
        "(arXiv 2605.06611)",
        "massive activations first appear in one layer (its norm and feed-forward) and then ride the residual "
        "stream; a few feed-forward 'super neurons' create the first-token disparity, and editing them moves the sink",
        "the first layer whose output gives the first token a norm 10x the others', the dimensions that carry it, the "
        "feed-forward neurons of that layer writing most toward them (activation x output weight), and the sink "
        "after those neurons are zeroed on the first token (against as many other neurons zeroed) or moved onto a "
        "token in the middle of the text",
        _run_origin,
        lambda options: 1,
        lambda options: [options["length"]],
        _plot_origin,
    )
)
