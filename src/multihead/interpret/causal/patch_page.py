"""The page of ``multihead patch``: one self-contained HTML file (no script, no network) that shows every head's
patching effect as a layers x heads grid coloured on a diverging scale (hover a cell for its numbers), attribution
patching beside it where it was computed, the heads of largest effect in a table, per-position effects of those
heads over the prompt's tokens when positions were patched, and the prompts themselves. Every text is escaped.
"""

from __future__ import annotations

import html
from pathlib import Path

import torch
from torch import Tensor

from ..._io import atomic_write_text

STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px; color: #222; max-width: 1400px; }
h1 { font-size: 18px; margin: 0 0 6px; } h2 { font-size: 15px; margin: 18px 0 6px; }
p.how { color: #555; margin: 4px 0 10px; }
.grids { display: flex; gap: 28px; flex-wrap: wrap; align-items: flex-start; }
table.grid { border-collapse: collapse; font-size: 10px; }
table.grid td { width: 18px; height: 12px; border: 1px solid #fff; }
table.grid th { font-weight: normal; color: #666; padding: 0 3px; }
table.top { border-collapse: collapse; font-size: 13px; }
table.top td, table.top th { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: right; }
table.pairs td { padding: 2px 8px; font-size: 13px; vertical-align: top; }
.legend { display: flex; align-items: center; gap: 6px; font-size: 12px; color: #555; margin-top: 4px; }
.bar { width: 160px; height: 10px; background: linear-gradient(to right, rgb(33,102,172), #f7f7f7, rgb(178,24,43)); }
.tokens span { display: inline-block; padding: 2px 3px; margin: 1px; border-radius: 2px; font-family: monospace;
  white-space: pre; }
"""


def _color(v: float, lim: float) -> str:
    """Blue (negative) - white - red (positive), as matplotlib's RdBu reversed."""
    if v != v:  # NaN: no such head
        return "#ddd"
    t = max(-1.0, min(1.0, v / lim)) if lim > 0 else 0.0
    neg, pos = (33, 102, 172), (178, 24, 43)
    end = pos if t > 0 else neg
    a = abs(t)
    r, g, b = (round(247 + (c - 247) * a) for c in end)
    return f"rgb({r},{g},{b})"


def _grid(values: Tensor, title: str, other: Tensor | None, other_name: str) -> str:
    lim = float(values.nan_to_num(0).abs().max())
    rows = [
        f"<div><h2>{html.escape(title)}</h2><table class='grid'><tr><th></th>"
        + "".join(f"<th>{h}</th>" for h in range(values.shape[1]))
        + "</tr>"
    ]
    for l in range(values.shape[0]):
        cells = []
        for h in range(values.shape[1]):
            v = float(values[l, h])
            tip = f"L{l}H{h}: {v:+.4f}"
            if other is not None:
                tip += f"; {other_name} {float(other[l, h]):+.4f}"
            cells.append(f"<td style='background:{_color(v, lim)}' title='{html.escape(tip)}'></td>")
        rows.append(f"<tr><th>L{l}</th>{''.join(cells)}</tr>")
    rows.append(f"</table><div class='legend'>{-lim:+.3g}<div class='bar'></div>{lim:+.3g}</div></div>")
    return "".join(rows)


def write_patch_page(path: Path, result: dict, *, tokens: list[str] | None = None) -> None:
    """``result``: what ``multihead patch`` writes to importance-patching.json (``effect`` ``(layers, H)`` or
    ``(layers, H, L)``; ``attribution`` when computed); ``tokens``: the first corrupted prompt's tokens, to label
    per-position effects."""
    effect = torch.tensor(result["effect"], dtype=torch.float32)
    per_position = effect.dim() == 3
    # per position: each head's effect at the position where it is largest in size, with its sign
    grid = effect.gather(-1, effect.nan_to_num(0).abs().argmax(-1, keepdim=True))[..., 0] if per_position else effect
    attribution = torch.tensor(result["attribution"]) if result.get("attribution") is not None else None
    metric = html.escape(result["metric"])
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Activation patching: "
        f"{html.escape(str(result['model']))}</title><style>{STYLE}</style></head><body>",
        f"<h1>Activation patching of every head: {html.escape(str(result['model']))}</h1>",
        "<p class='how'>Each cell is one head (row: layer, column: head). Its colour is the change of the metric ("
        f"{metric}) when that head's output in the corrupted run is replaced by its output in the clean run: red "
        "heads carry what the clean prompt adds, blue heads push the other way. Hover a cell for its value"
        + (
            " and the attribution-patching estimate (one forward and one backward pass)"
            if attribution is not None
            else ""
        )
        + ". Effects are the mean over the prompt pairs listed below.</p>",
        "<div class='grids'>",
        _grid(
            grid,
            "exact (activation patching)" + (": largest effect over positions" if per_position else ""),
            attribution,
            "attribution",
        ),
    ]
    if attribution is not None:
        parts.append(_grid(attribution, "attribution patching (first-order estimate)", grid, "exact"))
    parts.append("</div>")
    flat = grid.nan_to_num(0).flatten()
    order = flat.abs().argsort(descending=True)[:12]
    width = grid.shape[1]
    parts.append(
        "<h2>Heads of largest effect</h2><table class='top'><tr><th>head</th><th>exact</th>"
        + ("<th>attribution</th>" if attribution is not None else "")
        + "</tr>"
    )
    for i in order.tolist():
        l, h = divmod(i, width)
        parts.append(
            f"<tr><td>L{l}H{h}</td><td>{float(grid[l, h]):+.4f}</td>"
            + (f"<td>{float(attribution[l, h]):+.4f}</td>" if attribution is not None else "")
            + "</tr>"
        )
    parts.append("</table>")
    if result.get("correlation") is not None:
        parts.append(
            f"<p class='how'>Attribution vs exact over every head: correlation {result['correlation']:.3f}.</p>"
        )
    if per_position and tokens is not None:
        parts.append(
            "<h2>Where in the prompt (the heads above, per position)</h2><p class='how'>Each token's colour "
            "is the head's effect when patched at that position alone.</p>"
        )
        for i in order[:6].tolist():
            l, h = divmod(i, width)
            row = effect[l, h]
            lim = float(row.abs().max())
            spans = "".join(
                f"<span style='background:{_color(float(v), lim)}' title='{float(v):+.4f}'>{html.escape(t)}</span>"
                for t, v in zip(tokens, row.tolist())
            )
            parts.append(f"<div class='tokens'><b>L{l}H{h}</b> {spans}</div>")
    parts.append(
        "<h2>Prompt pairs</h2><table class='pairs'><tr><th>clean</th><th>corrupted</th><th>answer</th>"
        "<th>wrong</th><th>metric clean / corrupted</th></tr>"
    )
    for pair, v in zip(result["pairs"], result["per_pair"]):
        cells = [str(pair.get("clean")), str(pair.get("corrupt")), repr(pair.get("answer")), repr(pair.get("wrong"))]
        parts.append(
            "<tr>"
            + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
            + f"<td>{v['clean']:.3f} / {v['corrupt']:.3f}</td></tr>"
        )
    parts.append("</table></body></html>")
    atomic_write_text(path, "\n".join(parts))


__all__ = ["write_patch_page"]
