"""``multihead bench long``: attention layers at long lengths, time and peak memory, each case in a fresh process.

One multi-head self-attention layer, d_model 256, 4 heads (d_k 64), batch 1, fp32, L in {1k, 2k, 4k, 8k, 16k}.
``forward`` = eval + no_grad; ``train`` = forward + backward (input and parameters).

* ``tutorial`` -- the seed tutorial's explicit MHA; ``torch_mha`` -- ``nn.MultiheadAttention(need_weights=False)``;
* ``sdpa`` -- our module on PyTorch's fused kernel (dense, exact); ``memory_efficient`` -- our exact blockwise
  kernel with a recomputing backward;
* ``window`` -- sliding window w = 256 (``SparsePattern(window=256)``); ``block_sparse`` -- BigBird blocks of 64,
  1 neighbour block each side, 1 global block, 1 random block; ``flex_window`` -- the same window through
  FlexAttention (forward only on CPU);
* ``performer`` -- FAVOR+ with 256 features; ``linear_elu`` -- elu+1 linear attention;
* ``torch_flex_window`` -- the peer for the window cases: the same layer shape with PyTorch's own FlexAttention and
  its compiled window block mask (``create_block_mask(..., _compile=True)``).

Cases the machine cannot hold are skipped before they run (the estimate is stated), not crashed into.
``--device cuda --dtype bf16`` runs every case on the GPU in that dtype (default lengths 4k-64k there).
"""

from __future__ import annotations

from ..plotting import save as save_figure

import math
import time
from pathlib import Path

import torch

from .harness import DTYPES, check_impls, machine_info, make_step, run_case, target, write_json

SUITE = "multihead.bench.long"
D_MODEL, HEADS, WINDOW = 256, 4, 256
LENGTHS = [1024, 2048, 4096, 8192, 16384]
CUDA_LENGTHS = [4096, 16384, 65536]
MODES = ["forward", "train"]
IMPLS = [
    "tutorial",
    "torch_mha",
    "sdpa",
    "memory_efficient",
    "window",
    "block_sparse",
    "flex_window",
    "performer",
    "linear_elu",
    "torch_flex_window",
]
FLEX = {"flex_window", "torch_flex_window"}  # no backward on CPU
QUADRATIC = {"tutorial", "torch_mha"}  # build L x L per head
MEMORY_BUDGET_GB = 14.0


def _pattern(impl: str):
    from ..attention.patterns import SparsePattern

    if impl in ("window", "flex_window"):
        return SparsePattern(window=WINDOW)
    if impl == "block_sparse":
        return SparsePattern(block=64, window_blocks=1, global_blocks=1, random_blocks=1)
    return None


class _TorchFlexWindow(torch.nn.Module):
    """One MHA layer (q, k, v and output projections as ours) around PyTorch's own compiled FlexAttention with the
    window as its compiled block mask: PyTorch's recipe for sliding-window attention, as the peer."""

    def __init__(self, length: int, device) -> None:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        super().__init__()
        self.qkv, self.out = torch.nn.Linear(D_MODEL, 3 * D_MODEL), torch.nn.Linear(D_MODEL, D_MODEL)

        def window(b, h, i, j):
            return (i - j).abs() <= WINDOW

        self.block_mask = create_block_mask(window, None, None, length, length, device=device, _compile=True)
        self.attend = torch.compile(flex_attention, dynamic=False)

    def forward(self, x):
        b, n, e = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, HEADS, e // HEADS).permute(2, 0, 3, 1, 4)  # 3 x (b, h, n, d)
        o = self.attend(q, k, v, block_mask=self.block_mask)
        return self.out(o.transpose(1, 2).reshape(b, n, e))


def _layer(impl: str, length: int = 0, device=None):
    from torch import nn

    from ..modules.attention import MultiHeadAttention

    if impl == "torch_flex_window":
        m = _TorchFlexWindow(length, device)
        return m, m

    if impl == "tutorial":
        from ..tutorial import TutorialMultiHeadAttention

        m = TutorialMultiHeadAttention(D_MODEL, HEADS)
        return m, lambda x: m(x)[0]
    if impl == "torch_mha":
        m = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)
        return m, lambda x: m(x, x, x, need_weights=False)[0]
    backend = {"window": "window", "block_sparse": "block_sparse", "flex_window": "flex"}.get(impl, impl)
    m = MultiHeadAttention(D_MODEL, HEADS, backend=backend, need_weights=False, pattern=_pattern(impl))
    return m, lambda x: m(x)[0]


def estimate_gb(impl: str, mode: str, length: int, dtype: str = "fp32") -> float:
    """Rough peak for the quadratic implementations: L x L per head, ~2 live copies forward, ~5 in training."""
    if impl not in QUADRATIC:
        return 0.0
    size = torch.finfo(DTYPES[dtype]).bits // 8
    return HEADS * length * length * size * (5 if mode == "train" else 2) / 2**30


def memory_budget_gb(device: str) -> float:
    if device == "cuda":
        return 0.8 * torch.cuda.get_device_properties(0).total_memory / 2**30
    return MEMORY_BUDGET_GB


def flops(case: dict) -> float:
    length, e = case["length"], D_MODEL
    proj = 8 * length * e * e
    impl = case["impl"]
    if impl in ("window", "flex_window", "torch_flex_window"):
        att = 4 * length * (2 * WINDOW + 1) * e
    elif impl == "block_sparse":
        att = 4 * length * min(length, 64 * 4) * e
    elif impl in ("performer", "linear_elu"):
        att = 4 * length * e * (256 if impl == "performer" else e // HEADS)
    else:
        att = 4 * length * length * e
    return (proj + att) * (3 if case["mode"] == "train" else 1)


def build(case: dict):
    device, dtype = target(case)
    layer, fwd = _layer(case["impl"], case["length"], device)
    layer.to(device=device, dtype=dtype)
    train = case["mode"] == "train"
    # training: gradients w.r.t. input and weights
    x = torch.randn(1, case["length"], D_MODEL, device=device, dtype=dtype, requires_grad=train)
    step = make_step(layer, lambda: fwd(x), train=train)
    if case["impl"] in FLEX:
        step()  # compile outside the measurement (the first call would count compile time and memory)
    return step


def run(
    *,
    lengths=None,
    modes=None,
    impls=None,
    threads=None,
    out: Path | None = None,
    min_time: float = 1.0,
    progress=True,
    device: str = "cpu",
    dtype: str = "fp32",
) -> dict:
    from tqdm import tqdm

    cases, results = [], []
    budget = memory_budget_gb(device)
    for length in lengths or (CUDA_LENGTHS if device == "cuda" else LENGTHS):
        for mode in modes or MODES:
            for impl in impls or IMPLS:
                cases.append({"impl": impl, "mode": mode, "length": length, "device": device, "dtype": dtype})
    for c in tqdm(cases, desc="bench long", disable=not progress):
        need = estimate_gb(c["impl"], c["mode"], c["length"], dtype)
        if need > budget:
            results.append({**c, "error": f"skipped: needs ~{need:.0f} GiB for L x L scores"})
        elif c["impl"] in FLEX and c["mode"] == "train" and device == "cpu":
            results.append({**c, "error": "skipped: FlexAttention has no backward on CPU"})
        else:
            results.append(run_case(SUITE, c, threads=threads, min_time=min_time, timeout=900, min_repeats=2))
    payload = {
        "suite": "long",
        "config": {"d_model": D_MODEL, "heads": HEADS, "batch": 1, "window": WINDOW, "device": device, "dtype": dtype},
        "machine": machine_info(threads, device),
        "results": results,
        "fits": fit_exponents(results),
    }
    _ratios(payload)
    if out is not None:
        write_json(out, payload)
        plot(payload, out.with_suffix(".png"))
    return payload


def _ratios(payload: dict) -> None:
    base = {(r["mode"], r["length"]): r for r in payload["results"] if r["impl"] == "sdpa" and "error" not in r}
    for r in payload["results"]:
        ref = base.get((r["mode"], r["length"]))
        if ref and "error" not in r:
            r["speedup_vs_sdpa"] = ref["seconds_min"] / r["seconds_min"]
    peer = {
        (r["mode"], r["length"]): r for r in payload["results"] if r["impl"] == "torch_flex_window" and "error" not in r
    }
    for r in payload["results"]:
        ref = peer.get((r["mode"], r["length"]))
        if ref and "error" not in r and r["impl"] in ("window", "flex_window"):
            r["time_vs_torch_flex"] = r["seconds_min"] / ref["seconds_min"]


def fit_exponents(results: list[dict]) -> dict:
    """Least-squares slope of log(peak MiB) and log(seconds) on log(L), per implementation and mode."""
    out = {}
    for impl in {r["impl"] for r in results}:
        for mode in MODES:
            pts = [
                (r["length"], r["peak_mb"], r["seconds_min"])
                for r in results
                if r["impl"] == impl and r["mode"] == mode and "error" not in r and r.get("peak_mb")
            ]
            if len(pts) >= 3:
                xs = [math.log(p[0]) for p in pts]
                out[f"{impl}/{mode}"] = {
                    "memory": _slope(xs, [math.log(max(p[1], 1e-3)) for p in pts]),
                    "time": _slope(xs, [math.log(p[2]) for p in pts]),
                    "points": len(pts),
                }
    return out


def _slope(xs, ys) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs), 3)


def plot(payload: dict, path: Path) -> None:
    from ..plotting import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    colour = {impl: f"C{i}" for i, impl in enumerate(IMPLS)}  # one colour per implementation in every panel
    for col, mode in enumerate(MODES):
        for impl in IMPLS:
            pts = sorted(
                (r["length"], r["seconds_min"], r["peak_mb"])
                for r in payload["results"]
                if r["impl"] == impl and r["mode"] == mode and "error" not in r
            )
            if not pts:
                continue
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=impl, color=colour[impl])
            axes[1][col].plot(
                [p[0] for p in pts], [max(p[2] or 0, 0.1) for p in pts], "o-", label=impl, color=colour[impl]
            )
        axes[0][col].set_title(f"{mode}: time (s)", fontsize=10)
        axes[1][col].set_title(f"{mode}: peak memory above baseline (MiB)", fontsize=10)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.grid(alpha=0.3, which="both")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    m, c = payload["machine"], payload["config"]
    fig.suptitle(
        f"one MHA layer, d_model {D_MODEL}, {HEADS} heads, batch 1, {c.get('dtype', 'fp32')}, "
        f"{m.get('gpu') or str(m['threads']) + ' threads'}",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path, formats=("png",), dpi=100)
    plt.close(fig)


def format_table(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        f"torch {m['torch']} on {m.get('gpu') or str(m['threads']) + ' threads'}, "
        f"{payload['config'].get('dtype', 'fp32')}; speed-up = dense SDPA time / this time; vs flex = this time / "
        "PyTorch's own FlexAttention window layer",
        f"{'L':>6} {'mode':<8}{'impl':<18}{'min ms':>10}{'peak MiB':>10}{'vs sdpa':>9}{'vs flex':>9}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>6} {r['mode']:<8}{r['impl']:<18} {r['error']}")
            continue
        sp, fx = r.get("speedup_vs_sdpa"), r.get("time_vs_torch_flex")
        lines.append(
            f"{r['length']:>6} {r['mode']:<8}{r['impl']:<18}{1e3 * r['seconds_min']:>10.1f}"
            f"{r['peak_mb'] or 0:>10.0f}{(f'{sp:.2f}x' if sp else '-'):>9}{(f'{fx:.2f}x' if fx else '-'):>9}"
        )
    lines.append(
        "fitted exponents (peak memory ~ L^a, time ~ L^b): "
        + ", ".join(f"{k} a={v['memory']} b={v['time']}" for k, v in sorted(payload["fits"].items()))
    )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"long-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench long`` (the suite protocol in :mod:`multihead.bench`)."""
    check_impls(args.impls, IMPLS)
    return run(
        lengths=args.lengths,
        modes=args.modes,
        impls=args.impls,
        threads=args.threads,
        out=out,
        min_time=args.min_time,
        device=getattr(args, "device", "cpu"),
        dtype=getattr(args, "dtype", "fp32"),
    )
