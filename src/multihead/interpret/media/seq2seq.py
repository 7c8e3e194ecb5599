"""``multihead show`` and ``heads`` on an HF sequence-to-sequence folder (BART, Marian, T5...): the three kinds of
attention of an encoder-decoder, as the G2P pictures show them for a run.

The decoder reads what the model itself writes: the text is translated greedily (HF's ``generate``, multihead's
attention), then the output is fed back teacher-forced in one pass whose weights are captured. Rows of the decoder
and cross-attention maps are labelled with the token each step *produces* (a step reads the one before).

* **encoder self-attention** -- source tokens attending to source tokens ``(H, S, S)``;
* **decoder causal self-attention** -- output tokens attending to those before them ``(H, T, T)``;
* **cross-attention** -- each output token attending to the source ``(H, T, S)``.

::

    OUT/encoder_grid, decoder_grid, cross_grid .{png,svg}   layers x heads
    OUT/encoder.html, decoder.html, cross.html               offline pages
    OUT/attention.safetensors  encoder_{l}, decoder_{l}, cross_{l} weights;  OUT/summary.json  tokens, output
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import save

from ..._io import Publish, atomic_write_bytes, atomic_write_json, atomic_write_text
from ...modules.anatomy import anatomy
from ...modules.capture import capture
from ..pages import plots
from ..roles import scores as roles
from ..maps import AttentionMaps
from ..pages.page import write_page

KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder causal self-attention",
    "cross": "cross-attention (output -> source)",
}


@torch.no_grad()
def attention_of(folder, source: list[int], output: list[int]) -> dict[str, list[torch.Tensor]]:
    """Teacher-forced weights of ``source`` -> ``output`` (the decoder's tokens from its start token): per kind, per
    layer ``(H, Lq, Lk)``, from one forward pass."""
    model = folder.hf
    sites = anatomy(model).sites
    unplaced = [s.name for s in sites if s.role is None]
    if unplaced:
        raise ValueError(
            f"{type(model).__name__}: {unplaced[0]} cannot be placed in the encoder, the decoder or the cross-attention "
            "(the pass that attached it did not read an encoder and a decoder input of different lengths); attach it "
            "with the default probe"
        )
    device = next(model.parameters()).device
    x = torch.tensor([source], device=device)
    y = torch.tensor([output[:-1] if len(output) > 1 else output], device=device)
    with capture(model) as cache:
        model(input_ids=x, decoder_input_ids=y)
    by_name = dict(zip(cache.attention_modules, cache.patterns()))
    return {
        kind: [by_name[s.name][0].float() for s in sites if s.role == kind] for kind in ("encoder", "decoder", "cross")
    }


def maps_of(folder, text: str, *, max_new_tokens: int = 64) -> tuple[dict[str, AttentionMaps], list[int], list[int]]:
    """The three kinds of maps of ``text`` (see the module docstring), the source's and the decoder's token ids."""
    source = folder.encode(text)[: folder.max_len]
    output = folder.translate(source, max_new_tokens=max_new_tokens)
    kinds = attention_of(folder, source, output)
    src = folder.tokens(source)
    produced = folder.tokens(output[1:] if len(output) > 1 else output)
    name = f"{folder.path.name}"
    maps = {
        "encoder": AttentionMaps(text, src, kinds["encoder"], f"{name} {KINDS['encoder']}"),
        "decoder": AttentionMaps(text, produced, kinds["decoder"], f"{name} {KINDS['decoder']}"),
        "cross": AttentionMaps(text, produced, kinds["cross"], f"{name} {KINDS['cross']}", key_tokens=src),
    }
    return maps, source, output


def show_seq2seq(folder, text: str, out: Path, *, overwrite: bool = False, max_new_tokens: int = 64) -> dict:
    """Pictures, pages and the weights of one text (see the module docstring), built aside and swapped in."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError('the text to show is empty; pass a sentence, e.g. "The cat sat on the mat."')
    t0 = time.perf_counter()
    maps, source, output = maps_of(folder, text, max_new_tokens=max_new_tokens)
    target = Path(out)
    with Publish(target, "show", overwrite=overwrite, sources=(str(folder.path),)) as out:
        files = []
        for kind, m in maps.items():
            files += plots.plot_grid(m, out / f"{kind}_grid")
            files.append(write_page(m, out / f"{kind}.html"))
        weights = {f"{kind}_{l}": w.contiguous() for kind, m in maps.items() for l, w in enumerate(m.layers)}
        atomic_write_bytes(out / "attention.safetensors", save(weights))
        summary = {
            "model": str(folder.path),
            "text": text,
            "source_tokens": maps["encoder"].tokens,
            "output_tokens": maps["decoder"].tokens,
            "output": folder.tokenizer.decode(output, skip_special_tokens=True),
            "source_ids": source,
            "output_ids": output,
            "rule": "the decoder reads output_ids[:-1] (from its start token); row t of its maps produces output_ids[t+1]",
            "heads": {kind: m.heads for kind, m in maps.items()},
            "seconds": round(time.perf_counter() - t0, 2),
        }
        atomic_write_json(out / "summary.json", summary)
        atomic_write_text(out / "tokens.json", json.dumps(summary["source_tokens"], ensure_ascii=False))
        files += [out / "attention.safetensors", out / "summary.json"]
    summary["files"] = [str(target / Path(f).name) for f in files]
    return summary


def monotonicity(cross: torch.Tensor) -> float:
    """Share of decoding steps (after the first) whose most-attended source token is not left of the previous
    step's; ``cross`` ``(T, S)``."""
    peaks = cross.argmax(-1)
    return 1.0 if len(peaks) < 2 else float((peaks[1:] >= peaks[:-1]).float().mean())


def head_study(folder, texts: list[str], *, max_new_tokens: int = 64, progress: bool = True) -> dict:
    """Roles of the encoder's and the decoder's self-attention heads (:func:`multihead.interpret.roles.scores.analyse` over
    ``texts`` and the model's own outputs), and per cross-attention head its mean normalised entropy and
    monotonicity (does the attended source token move left to right as the output is written?)."""
    from tqdm import tqdm

    enc, dec, cross = [], [], []
    for text in tqdm(texts, desc="texts translated and read", disable=not progress, leave=False):
        maps, _, _ = maps_of(folder, text, max_new_tokens=max_new_tokens)
        enc.append(maps["encoder"])
        dec.append(maps["decoder"])
        cross.append(maps["cross"])
    per_head = []
    for l in range(cross[0].num_layers):
        for h in range(cross[0].heads[l]):
            ws = [m.layers[l][h] for m in cross]
            ent = [
                float(
                    (-(w * w.clamp_min(1e-30).log()).sum(-1) / max(1e-9, torch.log(torch.tensor(w.shape[-1])))).mean()
                )
                if w.shape[-1] > 1
                else 0.0
                for w in ws
            ]
            per_head.append(
                {
                    "layer": l,
                    "head": h,
                    "entropy_norm": round(sum(ent) / len(ent), 4),
                    "monotonicity": round(sum(monotonicity(w) for w in ws) / len(ws), 4),
                }
            )
    return {
        "model": str(folder.path),
        "texts": len(texts),
        "encoder": roles.analyse(enc),
        "decoder": roles.analyse(dec),
        "cross": {
            "rule": "entropy_norm: a step's entropy over the source / log(source length), mean over steps and texts; "
            "monotonicity: share of steps whose strongest source token is not left of the previous step's",
            "heads": per_head,
        },
    }


def format_study(result: dict) -> str:
    lines = [f"{result['model']}: {result['texts']} texts, each translated and read back"]
    for kind in ("encoder", "decoder"):
        counts = {r: n for r, n in result[kind]["counts"].items() if n}
        lines.append(f"{KINDS[kind]}: " + ", ".join(f"{n} {r}" for r, n in counts.items()))
    lines.append(f"{KINDS['cross']}: layer head  entropy  monotonicity")
    for h in result["cross"]["heads"]:
        lines.append(f"  L{h['layer']}H{h['head']}  {h['entropy_norm']:.3f}  {h['monotonicity']:.3f}")
    return "\n".join(lines)


def write_study(result: dict, out: Path, *, overwrite: bool = False, sources: tuple = ()) -> list[Path]:
    """``heads.json`` and the role pictures of the encoder and the decoder, built aside and swapped in whole."""
    target = Path(out)
    with Publish(target, "heads", overwrite=overwrite, sources=sources) as folder:
        atomic_write_json(folder / "heads.json", result)
        files = [folder / "heads.json"]
        for kind in ("encoder", "decoder"):
            r = {**result[kind], "model": f"{result['model']} {KINDS[kind]}"}
            files += roles.plot_roles(r, folder / f"{kind}_heads")
    return [target / f.name for f in files]


__all__ = ["attention_of", "format_study", "head_study", "maps_of", "monotonicity", "show_seq2seq", "write_study"]
