"""``multihead bench pretrained``: our encoder on the MiniLM-L6 weights vs HF ``BertModel`` on the same weights.

Batch 32 x 128 tokens. ``dense``: every sequence 128 real tokens; ``padded``: lengths drawn in [16, 128] (the first
kept at 128), as real text is. ``inference`` = eval + no_grad forward to the last hidden states; ``train`` = forward,
mean-pooled loss, backward and an AdamW step (fine-tuning). Peers: HF with ``attn_implementation="sdpa"`` (its
default, the same PyTorch kernel we call) and ``"eager"``. HF transformers is needed for the peers only.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import machine_info, make_step, run_case, write_json

SUITE = "multihead.bench.pretrained"
BATCH, LENGTH = 32, 128
IMPLS = ["hf_sdpa", "hf_eager", "multihead"]
MODES = ["inference", "train"]
BASELINE = "hf_sdpa"


def _batch(padded: bool):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (BATCH, LENGTH), generator=g)
    lengths = torch.randint(16, LENGTH + 1, (BATCH,), generator=g) if padded else torch.full((BATCH,), LENGTH)
    lengths[0] = LENGTH
    keep = torch.arange(LENGTH)[None, :] < lengths[:, None]  # (B, L), True = real token
    ids[:, 0] = 101  # [CLS]
    return ids.masked_fill(~keep, 0), keep


def _forward(impl: str):
    """``fn(ids, keep) -> (B, L, E)`` on the MiniLM weights."""
    from ..loading import kind

    path = kind("minilm").path
    if impl == "multihead":
        from ..loading import load as load_source  # the one loader: it knows what a source is

        model = load_source(path).detail.model
        return model, lambda ids, keep: model(ids, keep)
    try:
        import transformers
    except ImportError:
        raise SystemExit("HF transformers is not installed (pip install 'multihead[hf]'); it is only a peer") from None
    model = transformers.BertModel.from_pretrained(str(path), attn_implementation=impl.split("_")[1])
    return model, lambda ids, keep: model(input_ids=ids, attention_mask=keep.long()).last_hidden_state


def flops(case: dict) -> float:
    e, f, layers = 384, 1536, 6
    per_token = layers * (8 * e * e + 4 * e * f) + 4 * LENGTH * e * layers  # projections, FFN, attention (full L)
    return case["tokens"] * per_token * (3 if case["mode"] == "train" else 1)


def build(case: dict):
    model, fwd = _forward(case["impl"])
    ids, keep = _batch(case["padded"])
    w = keep.unsqueeze(-1).float()

    def pooled_loss(x):  # a loss through mean pooling of real tokens
        return ((x * w).sum(1) / w.sum(1)).pow(2).mean()

    return make_step(model, lambda: fwd(ids, keep), train=case["mode"] == "train", loss=pooled_loss, lr=1e-5)


def run(*, modes=None, impls=None, threads=None, out: Path | None = None, min_time: float = 2.0, progress=True) -> dict:
    from tqdm import tqdm

    cases = []
    for padded in (False, True):
        _, keep = _batch(padded)
        for mode in modes or MODES:
            for impl in impls or IMPLS:
                cases.append({"impl": impl, "mode": mode, "padded": padded, "tokens": int(keep.sum())})
    results = [
        run_case(SUITE, c, threads=threads, min_time=min_time)
        for c in tqdm(cases, desc="bench pretrained", disable=not progress)
    ]
    base = {(r["mode"], r["padded"]): r for r in results if r["impl"] == BASELINE and "error" not in r}
    for r in results:
        if "error" in r:
            continue
        r["tokens_per_second"] = r["tokens"] / r["seconds_min"]
        ref = base.get((r["mode"], r["padded"]))
        if ref:
            r[f"speedup_vs_{BASELINE}"] = ref["seconds_min"] / r["seconds_min"]
    payload = {
        "suite": "pretrained",
        "config": {
            "model": "minilm (all-MiniLM-L6-v2: 6 layers, 12 heads, d 384)",
            "batch": BATCH,
            "length": LENGTH,
            "baseline": BASELINE,
        },
        "machine": machine_info(threads),
        "results": results,
    }
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    lines = [
        f"torch {payload['machine']['torch']}, {payload['machine']['threads']} threads; MiniLM-L6 weights, "
        f"batch {BATCH} x {LENGTH}; speed-up = HF BertModel (sdpa) time / this time",
        f"{'mode':<11}{'padded':<8}{'impl':<11}{'min ms':>9}{'median ms':>11}{'tokens/s':>10}{'speed-up':>10}"
        f"{'peak MiB':>10}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['mode']:<11}{str(r['padded']):<8}{r['impl']:<11} {r['error']}")
            continue
        sp = r.get(f"speedup_vs_{BASELINE}")
        lines.append(
            f"{r['mode']:<11}{str(r['padded']):<8}{r['impl']:<11}{1e3 * r['seconds_min']:>9.1f}"
            f"{1e3 * r['seconds']:>11.1f}{r['tokens_per_second']:>10.0f}"
            f"{(f'{sp:.2f}x' if sp else '-'):>10}{r['peak_mb'] or 0:>10.0f}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"pretrained-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench pretrained`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(modes=args.modes, impls=args.impls, threads=args.threads, out=out, min_time=args.min_time)
