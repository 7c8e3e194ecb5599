"""``multihead bench kernels``: attention kernels alone (no projections), ours against PyTorch's, in one run.

Batch 1, 8 heads, head dim 64, a sliding window of w = 256 on each side for the sparse cases -- the shape of
the H200 kernel table. Each case runs in a fresh process (:mod:`.harness`); ``--device cuda --dtype bf16`` runs it on
the GPU (times after ``torch.cuda.synchronize``, peak from the CUDA allocator).

* ``sdpa`` -- ``F.scaled_dot_product_attention``, dense (the baseline of every ratio);
* ``torch_flex`` -- PyTorch's own FlexAttention with the window as a compiled block mask
  (``create_block_mask(..., _compile=True)``, ``torch.compile(flex_attention)``): the peer for the window cases;
* ``window`` -- our window kernel (``backend="window"``); ``flex`` -- our FlexAttention backend with the same
  ``SparsePattern`` (block mask from the pattern's geometry); ``auto`` -- what ``backend="auto"`` picks for the
  pattern (FlexAttention on CUDA, the window kernel on CPU);
* ``memory_efficient`` -- our exact dense kernel (the tile loop on CPU, compiled FlexAttention on CUDA).

Modes: ``forward`` (no grad) and ``train`` (forward + backward w.r.t. q, k, v). FLOPs: ``4 L n D H`` with ``n`` the
keys per query (``L``, or ``2 w + 1`` for the window), x3 for ``train``. Ratios in the same run: speed-up over dense
SDPA, and time against PyTorch's FlexAttention (``vs torch_flex``: ours / theirs, 1.0 = as fast).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import check_impls, machine_info, run_case, target, write_json

SUITE = "multihead.bench.kernels"
HEADS, HEAD_DIM, WINDOW = 8, 64, 256
LENGTHS = {"cpu": [1024, 4096], "cuda": [16384, 65536]}
MODES = ["forward", "train"]
IMPLS = ["sdpa", "torch_flex", "window", "flex", "auto", "memory_efficient"]
SPARSE = {"torch_flex", "window", "flex", "auto"}


def flops(case: dict) -> float:
    if case["impl"] == "matmul":
        return 2.0 * case["n"] ** 3
    n = case["length"]
    keys = min(n, 2 * WINDOW + 1) if case["impl"] in SPARSE else n
    return 4.0 * n * keys * HEAD_DIM * HEADS * (3 if case["mode"] == "train" else 1)


def _kernel(impl: str, length: int, device):
    import torch.nn.functional as F

    from ..attention import attention
    from ..attention.patterns import SparsePattern

    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    if impl == "torch_flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def window(b, h, i, j):
            return (i - j).abs() <= WINDOW

        block_mask = create_block_mask(window, None, None, length, length, device=device, _compile=True)
        fn = torch.compile(flex_attention, dynamic=False)
        return lambda q, k, v: fn(q, k, v, block_mask=block_mask)
    if impl == "memory_efficient":
        return lambda q, k, v: attention(q, k, v, backend="memory_efficient")[0]
    backend = {"window": "window", "flex": "flex", "auto": "auto"}[impl]
    pattern = SparsePattern(window=WINDOW)
    return lambda q, k, v: attention(q, k, v, mask=pattern, backend=backend)[0]


def build(case: dict):
    device, dtype = target(case)
    if case["impl"] == "matmul":
        a, b = (torch.randn(case["n"], case["n"], device=device, dtype=dtype) for _ in range(2))
        return lambda: torch.mm(a, b)
    length, train = case["length"], case["mode"] == "train"
    q, k, v = (
        torch.randn(1, HEADS, length, HEAD_DIM, device=device, dtype=dtype, requires_grad=train) for _ in range(3)
    )
    fn = _kernel(case["impl"], length, device)
    if not train:

        def step():
            with torch.no_grad():
                fn(q, k, v)

        return step
    grad = torch.randn(1, HEADS, length, HEAD_DIM, device=device, dtype=dtype)

    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(grad)

    return step


def skip_reason(case: dict) -> str | None:
    """Why a case is not run on this device (stated in the results), or None."""
    if case.get("device", "cpu") == "cpu" and case["mode"] == "train" and case["impl"] in ("torch_flex", "flex"):
        return "skipped: FlexAttention has no backward on CPU"
    return None


def run(
    *,
    lengths=None,
    modes=None,
    impls=None,
    threads=None,
    out: Path | None = None,
    min_time: float = 1.0,
    device: str = "cpu",
    dtype: str = "fp32",
    progress=True,
) -> dict:
    from tqdm import tqdm

    lengths = lengths or LENGTHS[device]
    where = {"device": device, "dtype": dtype}
    cases = [{"impl": "matmul", "n": 8192 if device == "cuda" else 2048, "mode": "forward", "length": 0, **where}]
    for length in lengths:
        for mode in modes or MODES:
            for impl in impls or IMPLS:
                cases.append({"impl": impl, "mode": mode, "length": length, **where})
    results = []
    for c in tqdm(cases, desc="bench kernels", disable=not progress):
        reason = skip_reason(c)
        results.append(
            {**c, "error": reason}
            if reason
            else run_case(SUITE, c, threads=threads, min_time=min_time, timeout=900, min_repeats=3)
        )
    matmul = results[0]
    payload = {
        "suite": "kernels",
        "config": {"batch": 1, "heads": HEADS, "head_dim": HEAD_DIM, "window": WINDOW, **where},
        "machine": machine_info(threads, device),
        "matmul_gflops": matmul.get("gflops"),
        "results": results[1:],
    }
    add_ratios(payload)
    if out is not None:
        write_json(out, payload)
    return payload


def add_ratios(payload: dict) -> None:
    rows = [r for r in payload["results"] if "error" not in r]
    by = {(r["impl"], r["mode"], r["length"]): r for r in rows}
    peak = payload.get("matmul_gflops")
    for r in rows:
        sdpa, flex = by.get(("sdpa", r["mode"], r["length"])), by.get(("torch_flex", r["mode"], r["length"]))
        r["speedup_vs_sdpa"] = sdpa["seconds_min"] / r["seconds_min"] if sdpa else None
        r["time_vs_torch_flex"] = r["seconds_min"] / flex["seconds_min"] if flex and r["impl"] in SPARSE else None
        r["fraction_of_matmul"] = r["gflops"] / peak if peak and r.get("gflops") else None


def format_table(payload: dict) -> str:
    c, m = payload["config"], payload["machine"]
    where = m.get("gpu") or f"{m['threads']} CPU threads"
    lines = [
        f"torch {m['torch']} on {where}, {c['dtype']}; batch 1, {c['heads']} heads, head dim {c['head_dim']}, "
        f"window {c['window']}; {c['dtype']} matmul: {(payload['matmul_gflops'] or 0) / 1e3:.1f} TFLOP/s",
        f"{'L':>6} {'mode':<8}{'impl':<18}{'min ms':>10}{'peak MiB':>10}{'vs sdpa':>9}{'vs torch_flex':>15}"
        f"{'TFLOP/s':>9}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>6} {r['mode']:<8}{r['impl']:<18} {r['error']}")
            continue
        sp, fx = r.get("speedup_vs_sdpa"), r.get("time_vs_torch_flex")
        lines.append(
            f"{r['length']:>6} {r['mode']:<8}{r['impl']:<18}{1e3 * r['seconds_min']:>10.2f}"
            f"{r['peak_mb'] or 0:>10.0f}{(f'{sp:.2f}x' if sp else '-'):>9}{(f'{fx:.2f}x' if fx else '-'):>15}"
            f"{(r['gflops'] or 0) / 1e3:>9.2f}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench kernels`` (the suite protocol in :mod:`multihead.bench`)."""
    check_impls(args.impls, IMPLS)
    return run(
        lengths=args.lengths,
        modes=args.modes,
        impls=args.impls,
        threads=args.threads,
        out=out,
        min_time=args.min_time,
        device=args.device,
        dtype=args.dtype,
    )
