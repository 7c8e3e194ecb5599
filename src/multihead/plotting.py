"""Figures for every part of multihead: one place that picks matplotlib's file backend, saves atomically (PNG + SVG)
and keeps user text literal.

``plain(text)`` escapes what matplotlib would otherwise read as markup: a token, a sentence, a class name or a path
containing ``$`` (``cost $5 and $10``) is drawn as written instead of as maths, and ``$\\frac{a}$`` no longer
crashes the renderer. Global settings (``text.parse_math``) are left alone, so a notebook's own figures are not
affected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._io import atomic_save_figure


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    if matplotlib.get_backend().lower() != "agg":
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain(text) -> str:
    """``text`` as literal characters for a matplotlib label or title (``$`` escaped, so no mathtext)."""
    return str(text).replace("$", r"\$")  # matplotlib draws an escaped dollar as a plain "$"


def save(fig, stem: str | Path, *, formats: tuple[str, ...] = ("png", "svg"), dpi: int = 110) -> list[Path]:
    """Save ``fig`` as ``stem.png`` and ``stem.svg`` (each written atomically), close it, return the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is not None:  # solve a constrained layout once, not once per draw of every format
        fig.canvas.draw()
        fig.set_layout_engine("none")
    paths = [atomic_save_figure(fig, stem.with_suffix(f".{fmt}"), dpi=dpi, bbox_inches="tight") for fmt in formats]
    pyplot().close(fig)
    return paths


__all__ = ["SIGNED", "curve", "head_grid", "head_grids", "plain", "plot_curves", "pyplot", "save"]


SIGNED = "RdBu_r"  # every signed effect (patching, attribution, circuits, the patching page): red +, blue -


def head_grid(scores, stem: str | Path, title: str) -> list[Path]:
    """A layers x heads grid of scores (NaN: a pruned head, left blank), each value written in its cell, with a
    colorbar; PNG + SVG. Scores of both signs (patching effects) use :data:`SIGNED` on a scale symmetric about 0
    (red helps, blue hurts); scores of one sign use viridis on their own range."""
    import math

    import torch

    plt = pyplot()
    layers, heads = scores.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * heads + 2), max(2.5, 0.5 * layers + 1.5)))
    finite = scores[torch.isfinite(scores)]
    signed = finite.numel() > 0 and float(finite.min()) < 0 < float(finite.max())
    if signed:
        lim = float(finite.abs().max())
        im = ax.imshow(scores.numpy(), cmap=SIGNED, vmin=-lim, vmax=lim, aspect="auto")
    else:
        im = ax.imshow(scores.numpy(), cmap="viridis", aspect="auto")
    for l in range(layers):
        for h in range(heads):
            v = float(scores[l, h])
            if not math.isnan(v):
                ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=6, color="black" if signed else "white")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(plain(title), fontsize=9)
    return save(fig, stem)


def head_grids(panels, stem: str | Path, title: str) -> list[Path]:
    """Layers x heads grids side by side, one per ``(title, scores (layers, H), ringed [(layer, head), ...])``, each
    on its own viridis scale with a colorbar; the ringed heads circled in red (NaN cells blank). PNG + SVG."""
    import torch

    plt = pyplot()
    layers, heads = panels[0][1].shape
    fig, axes = plt.subplots(
        1, len(panels), figsize=(len(panels) * max(3.2, 0.35 * heads + 1.8), max(3.0, 0.22 * layers + 1.6))
    )
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (name, scores, ringed) in zip(axes, panels):
        finite = scores[torch.isfinite(scores)]
        top = float(finite.max()) if finite.numel() else 1.0
        im = ax.imshow(scores.numpy(), cmap="viridis", vmin=0.0, vmax=max(top, 1e-6), aspect="auto")
        for layer, head in ringed:
            ax.scatter([head], [layer], s=60, facecolors="none", edgecolors="red", linewidths=1.2)
        ax.set_xticks(range(heads))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(plain(name), fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(plain(title), fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def curve(xs, ys, stem: str | Path, *, xlabel: str, ylabel: str, title: str) -> list[Path]:
    """One measured curve (points joined), gridded; PNG + SVG."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(list(xs), list(ys), "o-")
    ax.set_xlabel(plain(xlabel))
    ax.set_ylabel(plain(ylabel), fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(plain(title), fontsize=9)
    return save(fig, stem)


@dataclass(frozen=True)
class Line:
    """One curve of a training run: the value ``y`` of ``metrics.jsonl``'s ``event`` lines (times ``scale``)."""

    y: str
    label: str
    event: str = "eval"
    style: str = "o-"
    scale: float = 1.0


@dataclass(frozen=True)
class Panel:
    """One axes of a training-curve figure: its lines against the value ``x`` of the same events."""

    x: str
    lines: tuple[Line, ...]
    xlabel: str
    ylabel: str
    yscale: str = "linear"


def plot_curves(
    metrics_path: str | Path,
    stem: str | Path,
    panels: tuple[Panel, ...],
    *,
    title: str | None = None,
    formats: tuple[str, ...] = ("png", "svg"),
) -> list[Path]:
    """A run's training curves from its ``metrics.jsonl``, one panel side by side per :class:`Panel`; nothing is
    written (and ``[]`` returned) when no line has a point yet. Every task's curves are drawn here."""
    import json

    events = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    points = {
        (i, j): [(e[p.x], e[l.y] * l.scale) for e in events if e.get("event") == l.event and l.y in e and p.x in e]
        for i, p in enumerate(panels)
        for j, l in enumerate(p.lines)
    }
    if not any(points.values()):
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4) if len(panels) > 1 else (6, 4), squeeze=False)
    for i, (p, ax) in enumerate(zip(panels, axes[0])):
        labelled = False
        for j, l in enumerate(p.lines):
            if points[i, j]:
                xs, ys = zip(*points[i, j])
                ax.plot(xs, ys, l.style, label=plain(l.label) if l.label else None)
                labelled = labelled or bool(l.label)
        ax.set_xlabel(plain(p.xlabel))
        ax.set_ylabel(plain(p.ylabel))
        ax.set_yscale(p.yscale)
        ax.grid(alpha=0.3)
        if labelled:
            ax.legend()
    if title:
        axes[0][0].set_title(plain(title), fontsize=10)
    fig.tight_layout()
    return save(fig, Path(stem).with_suffix(""), formats=formats)
