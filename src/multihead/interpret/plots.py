"""Pictures of attention (matplotlib; each figure is written as PNG and SVG).

* :func:`plot_grid` -- layers x heads heatmaps with token labels;
* :func:`plot_head` -- one head at full size;
* :func:`plot_layer_mean` -- each layer's average over heads;
* :func:`plot_rollout` -- attention rollout (Abnar & Zuidema 2020), see :func:`rollout`.

Long inputs stay legible: tick labels are thinned to at most ``max_labels`` evenly spaced tokens, and figures grow
with the input up to a cap (a 512-token head is 24 inches, 150 labels).
"""

from __future__ import annotations

from ..plotting import plain, pyplot, save

import math
import textwrap
from pathlib import Path

import torch
from torch import Tensor

from .maps import AttentionMaps


_plt = pyplot
_save = save


def _ticks(tokens: list[str], max_labels: int) -> tuple[list[int], list[str]]:
    step = max(1, math.ceil(len(tokens) / max_labels))
    pos = list(range(0, len(tokens), step))
    return pos, [plain(tokens[i] if len(tokens[i]) <= 14 else tokens[i][:13] + "…") for i in pos]


def _label(
    ax,
    tokens: list[str],
    max_labels: int,
    fontsize: float,
    x: bool = True,
    y: bool = True,
    keys: list[str] | None = None,
) -> None:
    """Query tokens on the y axis, key tokens (``keys``, default the same) on the x axis."""
    if x:
        kpos, knames = _ticks(tokens if keys is None else keys, max_labels)
        ax.set_xticks(kpos, knames, rotation=90, fontsize=fontsize)
    else:
        ax.set_xticks([])
    if y:
        pos, names = _ticks(tokens, max_labels)
        ax.set_yticks(pos, names, fontsize=fontsize)
    else:
        ax.set_yticks([])


def rollout(maps: AttentionMaps, residual: float = 0.5) -> Tensor:
    """Attention rollout ``(L, L)``: per layer ``A = residual * I + (1 - residual) * mean_heads(W)`` (rows
    re-normalised), multiplied from the first layer up; row ``i`` says how much each input token flows into
    position ``i`` at the top (Abnar & Zuidema 2020)."""
    n = len(maps.tokens)
    eye = torch.eye(n)
    out = eye.clone()
    for w in maps.layers:
        a = residual * eye + (1 - residual) * (w.mean(0) if w.shape[0] else torch.zeros(n, n))
        a = a / a.sum(-1, keepdim=True)
        out = a @ out  # (L, L)
    return out


def _scale(n: int):
    """The colour scale of an attention map over ``n`` keys: 0..1 for short inputs; long inputs spread each row over
    many keys (weights ~1/n), which a linear 0..1 scale draws uniformly dark, so they get a logarithmic scale from
    0.1/n (zeros, e.g. masked keys, at its bottom). Returns the norm and how to prepare a map for it."""
    import matplotlib as mpl

    if n <= 32:
        return mpl.colors.Normalize(0, 1), lambda w: w, "attention weight"
    norm = mpl.colors.LogNorm(max(1e-4, 0.1 / n), 1.0, clip=True)
    return norm, lambda w: w.clip(norm.vmin, None), "attention weight (log scale)"


def plot_grid(maps: AttentionMaps, stem: Path, *, max_labels: int = 24, highlight: dict | None = None) -> list[Path]:
    """Every layer (rows) x head (columns). ``highlight`` maps ``(layer, head)`` to a caption drawn in red."""
    plt = _plt()
    rows, cols = maps.num_layers, max(maps.heads + [1])
    n = len(maps.tokens)
    cell = 1.5 if n <= 32 else 1.8
    fig, axes = plt.subplots(
        rows, cols, figsize=(cell * cols + 1, cell * rows + 1), squeeze=False, layout="constrained"
    )
    labels_each = n <= 12  # short inputs: token labels on the left column and bottom row
    fs = 5 if n <= 12 else 4
    norm, prep, what = _scale(len(maps.keys))
    shown = None
    for l in range(rows):
        for h in range(cols):
            ax = axes[l][h]
            if h >= maps.heads[l]:
                ax.axis("off")
                if h == 0:  # a layer whose heads were all pruned: say so rather than leave a blank row
                    ax.text(
                        0.5,
                        0.5,
                        f"L{l}: every head pruned",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="grey",
                        transform=ax.transAxes,
                    )
                continue
            w = maps.head(l, h).numpy()
            shown = ax.imshow(prep(w), cmap="viridis", norm=norm, interpolation="nearest")
            cap = (highlight or {}).get((l, h))
            ax.set_title(f"L{l} H{h}" + (f"\n{cap}" if cap else ""), fontsize=6, color="red" if cap else "black")
            _label(ax, maps.tokens, max_labels if labels_each else 8, fs, x=(l == rows - 1), y=(h == 0), keys=maps.keys)
            if cap:
                for side in ax.spines.values():
                    side.set_edgecolor("red")
                    side.set_linewidth(2)
    fig.suptitle(
        f"{plain(maps.model)}: attention per layer (rows) and head (columns); query rows, key columns\n"
        f"{_short(maps.text)}",
        fontsize=9,
    )
    if shown is not None:
        bar = fig.colorbar(shown, ax=axes, fraction=0.02, pad=0.01)
        bar.set_label(what, fontsize=8)
    return _save(fig, stem)


def plot_head(
    maps: AttentionMaps, layer: int, head: int, stem: Path, *, max_labels: int = 150, caption: str = ""
) -> list[Path]:
    plt = _plt()
    n = len(maps.tokens)
    size = min(24.0, max(5.0, 0.28 * n))
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    norm, prep, what = _scale(len(maps.keys))
    im = ax.imshow(prep(maps.head(layer, head).numpy()), cmap="viridis", norm=norm, interpolation="nearest")
    fs = max(5.0, min(10.0, 400 / max(1, min(n, max_labels))))
    _label(ax, maps.tokens, max_labels, fs, keys=maps.keys)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=what)
    # the title wrapped to the figure's width, above the axes and the colorbar (a long caption ran into the bar)
    title = f"{plain(maps.model)} layer {layer} head {head}" + (f": {caption}" if caption else "")
    width = max(40, int(12 * (size + 1.2)))
    fig.suptitle("\n".join(textwrap.wrap(title, width) + [_short(maps.text)]), fontsize=10)
    return _save(fig, stem)


def plot_layer_mean(maps: AttentionMaps, stem: Path, *, max_labels: int = 40) -> list[Path]:
    plt = _plt()
    cols = min(maps.num_layers, 4)
    rows = math.ceil(maps.num_layers / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + 0.8, 3.6 * rows), squeeze=False, layout="constrained")
    norm, prep, what = _scale(len(maps.keys))
    shown = None
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        if i >= maps.num_layers:
            ax.axis("off")
            continue
        w = maps.layers[i]
        mean = w.mean(0) if w.shape[0] else torch.zeros(len(maps.tokens), len(maps.keys))
        shown = ax.imshow(prep(mean.numpy()), cmap="viridis", norm=norm, interpolation="nearest")
        ax.set_title(f"layer {i}: mean of {w.shape[0]} heads", fontsize=8)
        _label(ax, maps.tokens, max_labels, 6, keys=maps.keys)
    fig.suptitle(f"{plain(maps.model)}: average attention per layer\n{_short(maps.text)}", fontsize=9)
    if shown is not None:
        fig.colorbar(shown, ax=axes, fraction=0.02, pad=0.01).set_label(what, fontsize=8)
    return _save(fig, stem)


def plot_rollout(maps: AttentionMaps, stem: Path, *, max_labels: int = 60) -> list[Path]:
    plt = _plt()
    n = len(maps.tokens)
    size = min(16.0, max(5.0, 0.25 * n))
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    from matplotlib.colors import PowerNorm

    # Rollout mass piles onto [CLS]; a square-root colour scale keeps the rest visible.
    im = ax.imshow(rollout(maps).numpy(), cmap="magma", norm=PowerNorm(0.5), interpolation="nearest")
    _label(ax, maps.tokens, max_labels, max(5.0, min(10.0, 400 / max(1, min(n, max_labels)))))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(
        f"{plain(maps.model)}: attention rollout over {maps.num_layers} layers (Abnar & Zuidema 2020)\n"
        f"{_short(maps.text)}",
        fontsize=10,
    )
    return _save(fig, stem)


def _short(text: str, n: int = 90) -> str:
    return plain(text if len(text) <= n else text[: n - 1] + "…")


__all__ = ["plot_grid", "plot_head", "plot_layer_mean", "plot_rollout", "rollout"]
