"""``multihead show``: every picture and the page for one text, in one folder.

::

    OUT/grid.{png,svg}         layers x heads          OUT/layer_mean.{png,svg}   average per layer
    OUT/rollout.{png,svg}      attention rollout       OUT/head_L{l}_H{h}.{png,svg}  chosen heads at full size
    OUT/attention.html         head view + model view (offline)
    OUT/attention.safetensors  the weights (layer_{l}: (H, L, L)), tokens.json beside it
    OUT/case_study.json        for "The cat sat on the mat.": the heads found for each link
"""
from __future__ import annotations

from .._io import atomic_write_json, atomic_write_text

import json
import time
from pathlib import Path

from safetensors.torch import save_file

from . import case_study, plots
from .maps import AttentionMaps, Subject
from .page import write_page


def show(subject: Subject, text: str, out: Path, *, heads: list[tuple[int, int]] | None = None,
         rollout: bool = True, log=print) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    maps: AttentionMaps = subject.maps(text)
    t_model = time.perf_counter() - t0
    highlights: dict = {}
    summary: dict = {"model": subject.name, "text": text, "tokens": maps.tokens, "heads": maps.heads}
    if case_study.is_case_sentence(text):
        results = case_study.run(maps)
        highlights = case_study.highlights(results)
        atomic_write_json(out / "case_study.json", results)
        summary["case_study"] = results
        log(case_study.format_results(results))
    chosen = list(heads or []) + [k for k in highlights if k not in (heads or [])]
    for l, h in chosen:
        if l >= maps.num_layers or h >= maps.heads[l]:
            raise ValueError(f"layer {l} head {h} does not exist; the model has heads per layer {maps.heads}")
    files = plots.plot_grid(maps, out / "grid", highlight=highlights)
    files += plots.plot_layer_mean(maps, out / "layer_mean")
    if rollout:
        files += plots.plot_rollout(maps, out / "rollout")
    for l, h in chosen:
        files += plots.plot_head(maps, l, h, out / f"head_L{l}_H{h}", caption=highlights.get((l, h), ""))
    files.append(write_page(maps, out / "attention.html", highlights=highlights))
    save_file({f"layer_{l}": w.contiguous() for l, w in enumerate(maps.layers)}, str(out / "attention.safetensors"))
    atomic_write_text(out / "tokens.json", json.dumps(maps.tokens, ensure_ascii=False))
    summary.update(files=[str(f) for f in files], seconds={"model": round(t_model, 3),
                                                           "total": round(time.perf_counter() - t0, 3)})
    return summary


__all__ = ["show"]
