"""Pictures of attention (matplotlib; each figure is written as PNG and SVG).

* :func:`plot_grid` -- layers x heads heatmaps with token labels;
* :func:`plot_head` -- one head at full size;
* :func:`plot_layer_mean` -- each layer's average over heads;
* :func:`plot_rollout` -- attention rollout (Abnar & Zuidema 2020), see :func:`rollout`.

Long inputs stay legible: tick labels are thinned to at most ``max_labels`` evenly spaced tokens, and figures grow
with the input up to a cap (a 512-token head is 24 inches, 150 labels).
"""

from __future__ import annotations

from ...plotting import plain, pyplot, save

import math
import textwrap
from pathlib import Path

import torch
from torch import Tensor

from ..maps import AttentionMaps


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


def _mosaic(ax, cells: dict, rows: int, cols: int, maps: AttentionMaps, *, max_labels: int, fontsize: float, gap_for):
    """Draw ``cells`` (``(row, col) -> (map (Q, K), title, caption or None)``) as one image on ``ax``: every map on
    the colour scale of :func:`_scale`, white gaps (``gap_for(nq, nk) -> (rows, cols)`` map cells) holding the
    titles, a caption in red with a red frame, query tokens down the left column and key tokens along the bottom
    row. One image and a few hundred texts draw in a second where as many matplotlib axes take tens of seconds.
    Returns the colour scale for the colorbar."""
    import matplotlib as mpl
    import numpy as np

    plt = _plt()
    nq, nk = len(maps.tokens), len(maps.keys)
    norm, prep, what = _scale(nk)
    cmap = mpl.colormaps["viridis"]
    gy, gx = gap_for(nq, nk)
    mosaic = np.ones((rows * nq + (rows - 1) * gy, cols * nk + (cols - 1) * gx, 4))
    for (r, c), (w, title, cap) in cells.items():
        y0, x0 = r * (nq + gy), c * (nk + gx)
        if w is None:  # nothing to draw here: the title says why
            ax.text(x0, y0 + nq / 2, title, ha="left", va="center", fontsize=7, color="grey")
            continue
        mosaic[y0 : y0 + nq, x0 : x0 + nk] = cmap(norm(prep(w)))
        text = title + (f"\n{textwrap.fill(textwrap.shorten(cap, 64), 34)}" if cap else "")
        ax.text(
            x0 + nk / 2 - 0.5,
            y0 - 0.7,
            text,
            ha="center",
            va="bottom",
            fontsize=fontsize + 1,
            color="red" if cap else "black",
        )
        if cap:
            ax.add_patch(plt.Rectangle((x0 - 0.5, y0 - 0.5), nk, nq, fill=False, ec="red", lw=2))
    ax.imshow(mosaic, interpolation="nearest", aspect="equal")
    (qpos, qnames), (kpos, knames) = _ticks(maps.tokens, max_labels), _ticks(maps.keys, max_labels)
    left = [r for r in range(rows) if cells.get((r, 0), (None,))[0] is not None]
    bottom = [
        c for c in range(cols) if cells.get((rows - 1, c), (None,))[0] is not None
    ]  # the keys: the same in every map
    ax.set_yticks([r * (nq + gy) + p for r in left for p in qpos], [t for _ in left for t in qnames], fontsize=fontsize)
    ax.set_xticks(
        [c * (nk + gx) + p for c in bottom for p in kpos],
        [t for _ in bottom for t in knames],
        rotation=90,
        fontsize=fontsize,
    )
    ax.tick_params(length=1.5, pad=1)
    for side in ax.spines.values():
        side.set_visible(False)
    return mpl.cm.ScalarMappable(norm=norm, cmap=cmap), what


def plot_grid(maps: AttentionMaps, stem: Path, *, max_labels: int = 24, highlight: dict | None = None) -> list[Path]:
    """Every layer (rows) x head (columns). ``highlight`` maps ``(layer, head)`` to a caption drawn in red. One
    mosaic image (:func:`_mosaic`): a 30-layer model's 270 heads draw in seconds, not as 270 matplotlib axes."""
    plt = _plt()
    rows, cols = maps.num_layers, max(maps.heads + [1])
    nq = len(maps.tokens)
    cell = 1.5 if nq <= 32 else 1.8
    cells: dict = {}
    for l in range(rows):
        if maps.heads[l] == 0:  # a layer whose heads were all pruned: say so rather than leave a blank row
            cells[(l, 0)] = (None, f"L{l}: every head pruned", None)
        for h in range(maps.heads[l]):
            cells[(l, h)] = (maps.head(l, h).numpy(), f"L{l} H{h}", (highlight or {}).get((l, h)))
    fig, ax = plt.subplots(figsize=(cell * cols + 1.6, cell * rows + 1.2))
    shown, what = _mosaic(
        ax,
        cells,
        rows,
        cols,
        maps,
        max_labels=max_labels if nq <= 12 else 8,  # short inputs: every token; else a few
        fontsize=5 if nq <= 12 else 4,
        gap_for=lambda nq, nk: (max(2, math.ceil(0.45 * nq)), max(1, math.ceil(0.15 * nk))),
    )
    ax.set_title(
        f"{plain(maps.model)}: attention per layer (rows) and head (columns); query rows, key columns\n"
        f"{_short(maps.text)}",
        fontsize=9,
        pad=14,
    )
    fig.colorbar(shown, ax=ax, fraction=0.02, pad=0.01).set_label(what, fontsize=8)
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
    """Each layer's attention averaged over its heads, four layers a row (one mosaic image, :func:`_mosaic`)."""
    plt = _plt()
    cols = min(maps.num_layers, 4)
    rows = math.ceil(maps.num_layers / cols)
    cells: dict = {}
    for i, w in enumerate(maps.layers):
        title = f"layer {i}: mean of {w.shape[0]} heads"
        cells[(i // cols, i % cols)] = (
            w.mean(0).numpy() if w.shape[0] else None,
            title + ("" if w.shape[0] else " (pruned)"),
            None,
        )
    fig, ax = plt.subplots(figsize=(3.6 * cols + 0.8, 3.6 * rows))
    shown, what = _mosaic(
        ax,
        cells,
        rows,
        cols,
        maps,
        max_labels=max_labels,
        fontsize=6,
        gap_for=lambda nq, nk: (max(2, math.ceil(0.2 * nq)), max(2, math.ceil(0.2 * nk))),
    )
    ax.set_title(f"{plain(maps.model)}: average attention per layer\n{_short(maps.text)}", fontsize=9, pad=14)
    fig.colorbar(shown, ax=ax, fraction=0.02, pad=0.01).set_label(what, fontsize=8)
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
