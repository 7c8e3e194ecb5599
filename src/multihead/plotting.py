"""Figures for every part of multihead: one place that picks matplotlib's file backend, saves atomically (PNG + SVG)
and keeps user text literal.

``plain(text)`` escapes what matplotlib would otherwise read as markup: a token, a sentence, a class name or a path
containing ``$`` (``cost $5 and $10``) is drawn as written instead of as maths, and ``$\\frac{a}$`` no longer
crashes the renderer. Global settings (``text.parse_math``) are left alone, so a notebook's own figures are not
affected.
"""

from __future__ import annotations

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
    paths = [atomic_save_figure(fig, stem.with_suffix(f".{fmt}"), dpi=dpi, bbox_inches="tight") for fmt in formats]
    pyplot().close(fig)
    return paths


__all__ = ["plain", "pyplot", "save"]


def head_grid(scores, stem: str | Path, title: str) -> list[Path]:
    """A layers x heads grid of scores (NaN: a pruned head, left blank), each value written in its cell, with a
    colorbar; PNG + SVG."""
    import math

    plt = pyplot()
    layers, heads = scores.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * heads + 2), max(2.5, 0.5 * layers + 1.5)))
    im = ax.imshow(scores.numpy(), cmap="viridis", aspect="auto")
    for l in range(layers):
        for h in range(heads):
            v = float(scores[l, h])
            if not math.isnan(v):
                ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(plain(title), fontsize=9)
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
