"""``multihead bench attention``: multi-head attention layers, ours and PyTorch's, timed in one run.

Implementations (all d_model=512, 8 heads, fp32, batch-first, self-attention):

* ``tutorial`` -- the seed tutorial's explicit MHA (materialises and returns the weights);
* ``torch_mha`` -- ``nn.MultiheadAttention(need_weights=False)``: in ``forward`` mode (eval + no_grad) this is its
  native fast path; in ``train`` mode its SDPA path;
* ``torch_mha_default`` -- ``nn.MultiheadAttention`` called with its default ``need_weights=True`` (forward only);
* ``multihead`` -- ``multihead.MultiHeadAttention`` with ``backend="auto"``, and ``multihead[NAME]`` per backend.

Modes: ``forward`` (eval, no grad) and ``train`` (forward + backward w.r.t. input and parameters).
FLOPs counted: projections ``8 B L E^2`` + scores and weighted sum ``4 B L^2 E``; ``train`` counts 3x forward.

``--device cuda --dtype bf16``: the same layers on the GPU in that dtype, at d_model 1024, 16 heads and L in
{1k, 4k, 16k} (a large-model shape), against a bf16 ``8192^3`` matmul measured in the same run (TFLOP/s).
"""

from __future__ import annotations

from ..plotting import save as save_figure

import time
from pathlib import Path

import torch
from torch import nn

from .harness import check_impls, machine_info, run_case, target, write_json

D_MODEL, HEADS = 512, 8
LENGTHS = [128, 512, 1024, 2048, 4096]
CUDA_SHAPE = {"d_model": 1024, "heads": 16, "lengths": [1024, 4096, 16384]}
MODES = ["forward", "train"]
SUITE = "multihead.bench.attention"


def batch_for(length: int) -> int:
    """4096 tokens per batch (1 sequence from L=4096): short sequences still do real work."""
    return max(1, 4096 // length)


def implementations() -> list[str]:
    from ..attention import list_backends

    dense = sorted(
        n
        for n, b in list_backends().items()  # dense exact kernels; sparse/linear: bench long
        if b.capabilities.exact and not b.capabilities.requires_pattern and n != "flex"
    )
    return ["tutorial", "torch_mha", "torch_mha_default", "multihead"] + [f"multihead[{n}]" for n in dense]


def flops(case: dict) -> float:
    if case["impl"] == "matmul":
        n = case["n"]
        return 2.0 * n**3
    b, l, e = case["batch"], case["length"], case.get("d_model", D_MODEL)
    fwd = 8 * b * l * e * e + 4 * b * l * l * e
    return fwd * (3 if case["mode"] == "train" else 1)


def _model(impl: str, d_model: int = D_MODEL, heads: int = HEADS) -> tuple[nn.Module, callable]:
    if impl == "tutorial":
        from ..tutorial import TutorialMultiHeadAttention

        m = TutorialMultiHeadAttention(d_model, heads)
        return m, lambda x: m(x)[0]
    if impl in ("torch_mha", "torch_mha_default"):
        m = nn.MultiheadAttention(d_model, heads, dropout=0.0, batch_first=True)
        if impl == "torch_mha":
            return m, lambda x: m(x, x, x, need_weights=False)[0]
        return m, lambda x: m(x, x, x)[0]
    if impl.startswith("multihead"):
        from ..modules.attention import MultiHeadAttention

        backend = impl[len("multihead[") : -1] if "[" in impl else "auto"
        m = MultiHeadAttention(d_model, heads, backend=backend, need_weights=False)
        return m, lambda x: m(x)[0]
    raise ValueError(f"unknown implementation {impl!r}; choose from {implementations()}")


def build(case: dict):
    device, dtype = target(case)
    if case["impl"] == "matmul":
        n = case["n"]
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        return lambda: torch.mm(a, b)
    e = case.get("d_model", D_MODEL)
    model, fn = _model(case["impl"], e, case.get("heads", HEADS))
    model.to(device=device, dtype=dtype)
    x = torch.randn(case["batch"], case["length"], e, device=device, dtype=dtype)
    if case["mode"] == "forward":
        model.eval()

        def step():
            with torch.no_grad():
                fn(x)

        return step
    model.train()
    x.requires_grad_(True)
    grad = torch.randn(case["batch"], case["length"], e, device=device, dtype=dtype)

    def step():
        model.zero_grad(set_to_none=True)
        x.grad = None
        fn(x).backward(grad)

    return step


def run(
    lengths=None,
    modes=None,
    impls=None,
    *,
    threads=None,
    out: Path | None = None,
    min_time: float = 1.0,
    progress=True,
    device: str = "cpu",
    dtype: str = "fp32",
) -> dict:
    from tqdm import tqdm

    cuda = device == "cuda"
    shape = {"d_model": CUDA_SHAPE["d_model"] if cuda else D_MODEL, "heads": CUDA_SHAPE["heads"] if cuda else HEADS}
    lengths = lengths or (CUDA_SHAPE["lengths"] if cuda else LENGTHS)
    modes = modes or MODES
    impls = impls or implementations()
    where = {"device": device, "dtype": dtype}
    cases = [{"impl": "matmul", "n": 8192 if cuda else 2048, "mode": "forward", "length": 0, "batch": 0, **where}]
    for mode in modes:
        for length in lengths:
            for impl in impls:
                if impl == "torch_mha_default" and mode == "train":
                    continue
                cases.append(
                    {"impl": impl, "mode": mode, "length": length, "batch": batch_for(length), **shape, **where}
                )
    results = []
    bar = tqdm(cases, desc="bench attention", disable=not progress)
    for case in bar:
        bar.set_postfix_str(f"{case['impl']} {case['mode']} L={case['length']}")
        results.append(run_case(SUITE, case, threads=threads, min_time=min_time))
    matmul = results[0]
    payload = {
        "suite": "attention",
        "config": {**shape, "dtype": dtype, "device": device, "batch_rule": "max(1, 4096 // L)"},
        "machine": machine_info(threads, device),
        "matmul_gflops": matmul.get("gflops"),
        "results": results[1:],
    }
    add_ratios(payload)
    if out is not None:
        write_json(out, payload)
        try:
            plot(payload, out.with_suffix(".png"))
        except Exception as exc:  # a plot is a convenience; the JSON is the record
            print(f"(plot skipped: {exc})")
    return payload


def add_ratios(payload: dict) -> None:
    """Time ratio against ``torch_mha`` in the same mode and length, and fraction of the matmul GFLOP/s.

    Ratios use each case's fastest repeat (``seconds_min``): on a shared machine interference only ever adds time,
    so the minimum is the least disturbed estimate; medians are kept in the JSON too."""
    base = {(r["mode"], r["length"]): r for r in payload["results"] if r["impl"] == "torch_mha" and "error" not in r}
    peak = payload.get("matmul_gflops")
    for r in payload["results"]:
        if "error" in r:
            continue
        ref = base.get((r["mode"], r["length"]))
        r["time_vs_torch_mha"] = r["seconds_min"] / ref["seconds_min"] if ref else None
        r["fraction_of_matmul"] = r["gflops"] / peak if peak and r.get("gflops") else None


def format_table(payload: dict) -> str:
    m, c = payload["machine"], payload["config"]
    lines = [
        f"torch {m['torch']} on {m.get('gpu') or str(m['threads']) + ' threads'}; d_model {c.get('d_model', D_MODEL)}, "
        f"{c.get('heads', HEADS)} heads, {c.get('dtype', 'fp32')}; same-dtype matmul: "
        f"{payload['matmul_gflops']:.1f} GFLOP/s",
        f"{'mode':<8}{'L':>6} {'impl':<22}{'min ms':>10}{'x torch_mha':>13}{'GFLOP/s':>9}{'%matmul':>9}{'peak MiB':>10}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['mode']:<8}{r['length']:>6} {r['impl']:<22}  {r['error']}")
            continue
        ratio = f"{r['time_vs_torch_mha']:.2f}x" if r.get("time_vs_torch_mha") else "-"
        frac = f"{100 * r['fraction_of_matmul']:.0f}%" if r.get("fraction_of_matmul") else "-"
        peak = f"{r['peak_mb']:.0f}" if r.get("peak_mb") is not None else "-"
        lines.append(
            f"{r['mode']:<8}{r['length']:>6} {r['impl']:<22}{1e3 * r['seconds_min']:>10.1f}{ratio:>13}"
            f"{r['gflops']:>9.1f}{frac:>9}{peak:>10}"
        )
    return "\n".join(lines)


def plot(payload: dict, path: Path) -> None:
    from ..plotting import pyplot

    plt = pyplot()

    modes = sorted({r["mode"] for r in payload["results"]})
    fig, axes = plt.subplots(2, len(modes), figsize=(6 * len(modes), 8), squeeze=False)
    for col, mode in enumerate(modes):
        rows = [r for r in payload["results"] if r["mode"] == mode and "error" not in r]
        for impl in sorted({r["impl"] for r in rows}):
            pts = sorted((r["length"], r["seconds"], r["peak_mb"] or 0) for r in rows if r["impl"] == impl)
            xs = [p[0] for p in pts]
            axes[0][col].plot(xs, [p[1] * 1e3 for p in pts], marker="o", label=impl)
            axes[1][col].plot(xs, [max(p[2], 1e-1) for p in pts], marker="o", label=impl)
        for row, ylabel in enumerate(["time (ms)", "peak extra memory (MiB)"]):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.set_ylabel(ylabel)
            c = payload["config"]
            ax.set_title(
                f"{mode}: d_model {c.get('d_model', D_MODEL)}, {c.get('heads', HEADS)} heads, {c.get('dtype', 'fp32')}"
            )
            ax.grid(True, which="both", alpha=0.3)
        axes[0][col].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, formats=("png",), dpi=110)
    plt.close(fig)


def default_out() -> Path:
    return Path("bench/results") / f"attention-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench attention`` (the suite protocol in :mod:`multihead.bench`)."""
    check_impls(args.impls, implementations())
    return run(
        args.lengths,
        args.modes,
        args.impls,
        threads=args.threads,
        out=out,
        min_time=args.min_time,
        device=getattr(args, "device", "cpu"),
        dtype=getattr(args, "dtype", "fp32"),
    )
