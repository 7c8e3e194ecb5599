"""``multihead bench precision``: the error of decoding with weights stored in bf16 or int8
(:mod:`multihead.models.precision`) against float32, on a pretrained causal LM (default SmolLM2-135M).

For each format, against the float32 model read from the same file:

* **logits** -- the largest absolute difference of the next-token logits over every position of held-out text
  (``--rows`` rows of ``--length`` tokens of IMDB's fixed test split, read teacher-forced), and the float32 logits'
  own scale beside it;
* **greedy agreement** -- ``--tokens`` greedy tokens from the start of a held-out row: the share equal to float32's
  at the same position, and the first position where they part;
* **perplexity** -- on the same held-out rows, beside float32's.

The speed of each format is ``bench decode``'s (its ``cached_bf16`` and ``cached_int8`` cases).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

FORMATS = ("bf16", "int8")


def default_out() -> Path:
    return Path("bench/results") / f"precision-{time.strftime('%Y%m%d-%H%M%S')}.json"


@torch.no_grad()
def _read(model, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Teacher-forced logits ``(R, L, V)`` of ``rows`` and their perplexity."""
    logits = torch.cat([model(rows[i : i + 1]) for i in range(rows.shape[0])])
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), rows[:, 1:].reshape(-1))
    return logits, math.exp(float(nll))


def run(
    *, model: str = "smollm2", rows: int = 4, length: int = 256, tokens: int = 512, out: Path | None = None
) -> dict:
    from ..data.lm_text import held_out_rows
    from ..loading import load
    from ..models.generation import generate
    from ..models.precision import convert
    from .harness import machine_info, write_json

    lm = load(model).detail
    base = lm.model.eval()
    text = held_out_rows(lm, rows=rows, length=length)
    prompt = held_out_rows(lm, rows=1, length=16, skip=rows)
    ref_logits, ref_ppl = _read(base, text)
    ref_tokens = generate(base, prompt, max_new_tokens=tokens).tokens[0]
    results = [{"dtype": "fp32", "perplexity": ref_ppl, "logit_scale": float(ref_logits.abs().max())}]
    payload = {"suite": "precision", "config": {"model": model, "rows": rows, "length": length, "tokens": tokens}}
    for fmt in FORMATS:
        q = convert(copy.deepcopy(base), fmt)
        logits, ppl = _read(q, text)
        made = generate(q, prompt, max_new_tokens=tokens).tokens[0]
        same = [a == b for a, b in zip(made, ref_tokens)]
        results.append(
            {
                "dtype": fmt,
                "max_logit_difference": float((logits - ref_logits).abs().max()),
                "perplexity": ppl,
                "perplexity_vs_fp32": ppl / ref_ppl,
                "greedy_agreement": sum(same) / len(same),
                "first_difference": same.index(False) if False in same else None,
                "weight_bytes": sum(b.numel() * b.element_size() for b in q.buffers() if b.dtype != torch.float32),
            }
        )
        payload.update(results=results, machine=machine_info(None))
        if out is not None:
            write_json(out, payload)
        del q
    payload.update(results=results, machine=machine_info(None))
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    c = payload["config"]
    lines = [
        f"{c['model']}: weights stored in each format against float32; logits over {c['rows']} x {c['length']} "
        f"held-out tokens, greedy agreement over {c['tokens']} tokens",
        f"{'dtype':<6}{'max |logit diff|':>18}{'perplexity':>12}{'vs fp32':>9}{'greedy same':>13}{'first diff':>12}",
    ]
    for r in payload["results"]:
        if r["dtype"] == "fp32":
            lines.append(
                f"{'fp32':<6}{'-':>18}{r['perplexity']:>12.3f}{'-':>9}{'-':>13}{'-':>12}   (logits up to {r['logit_scale']:.1f})"
            )
            continue
        first = "-" if r["first_difference"] is None else str(r["first_difference"])
        lines.append(
            f"{r['dtype']:<6}{r['max_logit_difference']:>18.4f}{r['perplexity']:>12.3f}{r['perplexity_vs_fp32']:>9.4f}"
            f"{r['greedy_agreement']:>13.1%}{first:>12}"
        )
    return "\n".join(lines)


def from_args(args, out: Path) -> dict:
    """``multihead bench precision [--model LM] [--lengths N]`` (N: the greedy tokens compared, default 512)."""
    from ..loading import kind

    model = getattr(args, "model", None) or "smollm2"

    if kind(model).name != "lm":
        raise ValueError(
            f"bench precision reads a pretrained causal LM (smollm2, a .gguf file, an HF folder); got {model}"
        )
    lengths = getattr(args, "lengths", None)
    tokens = max(lengths) if lengths else 512
    return run(model=model, tokens=tokens, out=out)


__all__ = ["FORMATS", "default_out", "format_table", "from_args", "run"]
