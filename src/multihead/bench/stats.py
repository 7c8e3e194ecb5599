"""``multihead bench stats``: exact per-head attention statistics at long lengths, against the fused forward and the
materialised map, each case in a fresh process (time and peak memory above the inputs).

Batch 1, 8 heads, head dim 64, fp32, L in {1k, 4k, 16k, 32k}; q, k, v random and built before the measurement.

* ``sdpa`` -- ``F.scaled_dot_product_attention`` forward (PyTorch's fused kernel: no map, no statistics);
* ``memory_efficient`` -- our exact tiled kernel's forward (returns the row log-sum-exp);
* ``stats`` -- :func:`multihead.attention.stats.attention_stats`: entropy, received mass, distance, first-token mass
  and top-8 keys of every query and head (``stats_causal``: the same under a causal mask);
* ``full_map`` -- ``softmax(q k^T)`` materialised ``(1, 8, L, L)`` and the same statistics read from it: what
  ``capture`` does today. Skipped, with its estimate, where the map cannot fit.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from .harness import check_impls, machine_info, run_case, write_json

SUITE = "multihead.bench.stats"
HEADS, HEAD_DIM, TOPK = 8, 64, 8
LENGTHS = [1024, 4096, 16384, 32768]
IMPLS = ["sdpa", "memory_efficient", "stats", "stats_causal", "full_map"]
MEMORY_BUDGET_GB = 14.0


def map_gb(length: int) -> float:
    """The materialised map's peak: scores and weights, fp32, (1, 8, L, L) each."""
    return 2 * HEADS * length * length * 4 / 2**30


def build(case: dict):
    import torch.nn.functional as F

    length, impl = case["length"], case["impl"]
    q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM) for _ in range(3))
    if impl == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v)
    if impl == "memory_efficient":
        from ..attention.backends.memory_efficient import memory_efficient_attention

        return lambda: memory_efficient_attention(q, k, v)
    if impl in ("stats", "stats_causal"):
        from ..attention.stats import attention_stats

        return lambda: attention_stats(q, k, is_causal=impl == "stats_causal", topk=TOPK)

    def full_map():
        p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM), -1)  # (1, 8, L, L)
        ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
        return ent, p.sum(-2), p[..., 0], p.topk(TOPK, -1)

    return full_map


def flops(case: dict) -> float:
    length, impl = case["length"], case["impl"]
    per_pass = 2 * HEADS * length * length * HEAD_DIM  # one q k^T
    passes = {"sdpa": 2, "memory_efficient": 2, "stats": 2, "stats_causal": 1, "full_map": 1}[impl]
    return per_pass * passes


def run(
    *, lengths=None, impls=None, threads=None, out: Path | None = None, min_time: float = 1.0, progress=True
) -> dict:
    from tqdm import tqdm

    check_impls(impls, IMPLS)
    cases = [{"impl": i, "length": n} for n in (lengths or LENGTHS) for i in (impls or IMPLS)]
    results = []
    for c in tqdm(cases, desc="bench stats", disable=not progress):
        if c["impl"] == "full_map" and map_gb(c["length"]) > MEMORY_BUDGET_GB:
            results.append({**c, "error": f"skipped: the map needs ~{map_gb(c['length']):.0f} GiB"})
            continue
        results.append(
            run_case(
                SUITE, c, threads=threads, min_time=min_time, timeout=1800, min_repeats=1 if c["length"] >= 16384 else 2
            )
        )
    payload = {
        "suite": "stats",
        "config": {"heads": HEADS, "head_dim": HEAD_DIM, "batch": 1, "dtype": "float32", "topk": TOPK},
        "machine": machine_info(threads),
        "results": results,
    }
    base = {r["length"]: r for r in results if r["impl"] == "sdpa" and "error" not in r}
    for r in results:
        ref = base.get(r["length"])
        if ref and "error" not in r:
            r["time_vs_sdpa"] = r["seconds_min"] / ref["seconds_min"]
            if r.get("peak_mb") and ref.get("peak_mb"):
                r["memory_vs_sdpa"] = r["peak_mb"] / ref["peak_mb"]
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    lines = [
        f"torch {payload['machine']['torch']}, {payload['machine']['threads']} threads; batch 1, {HEADS} heads, "
        f"head dim {HEAD_DIM}, fp32; ratios against the SDPA forward at the same L",
        f"{'L':>6} {'impl':<18}{'seconds':>10}{'peak MiB':>10}{'time x':>8}{'memory x':>10}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>6} {r['impl']:<18} {r['error']}")
            continue
        t, m = r.get("time_vs_sdpa"), r.get("memory_vs_sdpa")
        lines.append(
            f"{r['length']:>6} {r['impl']:<18}{r['seconds_min']:>10.3f}{r['peak_mb'] or 0:>10.0f}"
            f"{(f'{t:.2f}' if t else '-'):>8}{(f'{m:.2f}' if m else '-'):>10}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"stats-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench stats`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(lengths=args.lengths, impls=args.impls, threads=args.threads, out=out, min_time=args.min_time)
