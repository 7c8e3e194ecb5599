"""``multihead show``: every picture and the page for one text, in one folder.

::

    OUT/grid.{png,svg}         layers x heads          OUT/layer_mean.{png,svg}   average per layer
    OUT/rollout.{png,svg}      attention rollout       OUT/head_L{l}_H{h}.{png,svg}  chosen heads at full size
    OUT/attention.html         head view + model view (offline)
    OUT/attention.safetensors  the weights (layer_{l}: (H, L, L)), tokens.json beside it
    OUT/case_study.json        for "The cat sat on the mat.": the heads found for each link

Inputs over 1,024 tokens (models that read them: rotary positions, ``--max-len``) build no map: the page carries each
head's top-8 links per token and a thumbnail, computed as exact statistics on the model's own path, and
``links.safetensors`` holds them (``layer_{l}.index`` / ``.weight`` ``(H, L, 8)``, ``.thumbnail`` ``(H, 64, 64)``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import save

from ..._io import Publish, atomic_write_bytes, atomic_write_json, atomic_write_text

from ..roles import case_study
from . import plots
from ..maps import LONG, AttentionMaps, Subject
from .page import write_page


def show(
    subject: Subject,
    text: str,
    out: Path,
    *,
    heads: list[tuple[int, int]] | None = None,
    rollout: bool = True,
    overwrite: bool = False,
    log=print,
) -> dict:
    """Write every picture and the page for ``text`` to ``out``, built aside and swapped in whole (a folder of
    another kind is refused unless ``overwrite``)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError('the text to show is empty; pass a sentence, e.g. "The cat sat on the mat."')
    target = Path(out)
    with Publish(target, "show", overwrite=overwrite, sources=(subject.name,)) as out:
        summary = _show(subject, text, out, heads=heads, rollout=rollout, log=log)
    summary["files"] = [str(target / Path(f).name) for f in summary["files"]]
    return summary


def _show_long(subject: Subject, text: str, out: Path, *, heads, log) -> dict:
    """Inputs over :data:`~multihead.interpret.maps.LONG` tokens: no map is built. The page from each head's top-k
    links and thumbnails (exact statistics on the model's own path), the links in ``links.safetensors``."""
    from .page import subject_link_maps

    t0 = time.perf_counter()
    if heads:
        raise ValueError(
            f"--heads draws full maps, which inputs over {LONG} tokens do not build; open the page: it "
            "draws any head's map from its stored links"
        )
    lm, cut = subject_link_maps(subject, text)
    if cut:
        log(
            f"note: the text has {cut} more tokens than the model's {len(lm.tokens)}-token limit; only the first part "
            "is shown"
        )
    files = [write_page(lm, out / "attention.html")]
    tensors = {}
    for l in range(len(lm.weight)):
        tensors.update(
            {
                f"layer_{l}.index": lm.index[l].to(torch.int32).contiguous(),
                f"layer_{l}.weight": lm.weight[l].contiguous(),
                f"layer_{l}.thumbnail": lm.thumbs[l].contiguous(),
            }
        )
    atomic_write_bytes(out / "links.safetensors", save(tensors))
    atomic_write_text(out / "tokens.json", json.dumps(lm.tokens, ensure_ascii=False))
    files += [out / "links.safetensors", out / "tokens.json"]
    return {
        "model": subject.name,
        "text": text[:2000],
        "tokens": lm.tokens,
        "heads": lm.heads,
        "truncated": cut,
        "computed_from": "stats",
        "files": [str(f) for f in files],
        "seconds": {"total": round(time.perf_counter() - t0, 3)},
    }


def _show(subject: Subject, text: str, out: Path, *, heads, rollout: bool, log) -> dict:
    if subject.max_len > LONG and subject.length(text) > LONG:
        return _show_long(subject, text, out, heads=heads, log=log)
    t0 = time.perf_counter()
    maps: AttentionMaps = subject.maps(text)
    if getattr(maps, "truncated", 0):
        log(
            f"note: the text has {maps.truncated} more tokens than the model's {len(maps.tokens)}-token limit; "
            "only the first part is shown"
        )
    t_model = time.perf_counter() - t0
    highlights: dict = {}
    summary: dict = {"model": subject.name, "text": text, "tokens": maps.tokens, "heads": maps.heads}
    if case_study.is_case_sentence(text):
        results = case_study.run(maps)
        highlights, test = _tested(subject, case_study.highlights(results), log)
        atomic_write_json(out / "case_study.json", results)
        if test is not None:
            atomic_write_json(out / "role_test.json", test)
            summary["role_test"] = test
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
    atomic_write_bytes(
        out / "attention.safetensors", save({f"layer_{l}": w.contiguous() for l, w in enumerate(maps.layers)})
    )
    atomic_write_text(out / "tokens.json", json.dumps(maps.tokens, ensure_ascii=False))
    summary.update(
        truncated=getattr(maps, "truncated", 0),
        files=[str(f) for f in files],
        seconds={"model": round(t_model, 3), "total": round(time.perf_counter() - t0, 3)},
    )
    return summary


def _tested(subject: Subject, found: dict, log) -> tuple[dict, dict | None]:
    """The case study's heads, the determiner -> noun head that passes the separating test of
    :mod:`.role_test` first (the page opens on it); a head the sentence alone picked that fails the test says so.
    Also the test's record (``role_test.json``), or None where it could not run."""
    from ..roles.evidence import determiner_noun_test

    try:
        test = determiner_noun_test(subject)
    except ValueError as exc:  # a tokenizer that splits the test's words otherwise
        log(f"note: the determiner -> noun test could not run ({exc})")
        return found, None
    out: dict = {}
    if test.passed is not None:
        s = test.score(*test.passed)
        out[test.passed] = (
            f"determiner -> noun, tested: noun {s['noun']:.0%}, {'previous' if test.causal else 'next'} word "
            f"{s['adjacent']:.0%} on sentences where they differ"
        )
        log(test.describe(*test.passed))
    for key, caption in found.items():
        if "determiner" in caption and key != test.passed:
            caption += f"; on this sentence only (the separating test: noun {test.score(*key)['noun']:.0%})"
            log(test.describe(*key))
        out[key] = caption if key not in out else out[key] + "; " + caption
    return out, test.to_dict()


__all__ = ["show"]
