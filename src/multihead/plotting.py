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
