"""The bench seam: every case runs in a fresh Python process (so peak memory is the case's own), peers and our
backends in the same run, results as JSON with the machine's facts (threads, torch version) beside them.

A suite module provides ``build(case) -> step`` (a zero-argument callable doing one timed iteration) and
``flops(case) -> float``. The worker measures:

* ``peak_mb``: the process's peak resident memory during the first call above what it held before it (Linux
  ``VmHWM`` reset through ``/proc/self/clear_refs``), in MiB;
* ``seconds`` / ``seconds_min``: the median and the fastest of repeated calls after that warm-up (at least
  ``min_repeats``, until ``min_time``); GFLOP/s and ratios use the fastest (interference only adds time).

On CUDA (a case's ``device``, from ``multihead bench SUITE --device cuda --dtype bf16``) every call is followed by
``torch.cuda.synchronize()`` so the time is the kernels', and ``peak_mb`` is ``torch.cuda.max_memory_allocated``
above what the process held before the first call.
"""

from __future__ import annotations

from .._io import atomic_write_json

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable

import torch

from .._proc import cpu_model, status_kib


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEVICES = ("cpu", "cuda")


def target(case: dict) -> tuple[torch.device, torch.dtype]:
    """The device and dtype a case runs in (``cpu`` / ``fp32`` unless the case says otherwise)."""
    return torch.device(case.get("device", "cpu")), DTYPES[case.get("dtype", "fp32")]


def check_target(device: str, dtype: str) -> None:
    """Refuse, before anything runs, a device or dtype this machine cannot honour (the message names the fix)."""
    if device not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda needs a CUDA GPU, and torch.cuda.is_available() is False on this machine "
            "(no GPU, or a CPU-only PyTorch build); run it on a GPU machine or leave --device at cpu"
        )


def check_impls(given, known) -> None:
    """Refuse unknown ``--impls`` names before anything runs, listing the suite's own."""
    bad = [i for i in (given or []) if i not in known]
    if bad:
        raise ValueError(f"unknown implementation(s) {bad}; choose from {', '.join(known)}")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(
    step: Callable[[], None], *, min_repeats: int = 3, min_time: float = 1.0, max_repeats: int = 50, device: str = "cpu"
) -> dict:
    if device == "cuda":
        return _measure_cuda(step, min_repeats=min_repeats, min_time=min_time, max_repeats=max_repeats)
    before = status_kib("VmRSS")
    can_reset = _reset_peak()
    step()  # warm-up, and the memory measurement
    peak = status_kib("VmHWM") if can_reset else 0
    times = _repeat(step, min_repeats, min_time, max_repeats)
    return {
        "seconds": statistics.median(times),
        "seconds_min": min(times),
        "repeats": len(times),
        "peak_mb": max(0.0, (peak - before) / 1024) if can_reset else None,
    }


def _repeat(step, min_repeats: int, min_time: float, max_repeats: int, sync=lambda: None) -> list[float]:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeats or (time.perf_counter() - start < min_time and len(times) < max_repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _measure_cuda(step, *, min_repeats: int, min_time: float, max_repeats: int) -> dict:
    sync = torch.cuda.synchronize
    sync()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()  # warm-up (compilation, autotuning), and the memory measurement
    sync()
    peak = torch.cuda.max_memory_allocated()
    times = _repeat(step, min_repeats, min_time, max_repeats, sync)
    return {
        "seconds": statistics.median(times),
        "seconds_min": min(times),
        "repeats": len(times),
        "peak_mb": max(0.0, (peak - before) / 2**20),
        "device": torch.cuda.get_device_name(),
    }


def make_step(
    model: torch.nn.Module,
    forward: Callable[[], torch.Tensor],
    *,
    train: bool,
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    lr: float | None = None,
):
    """One timed iteration of ``forward()``: eval + no_grad, or (``train``) ``loss(forward()).backward()`` after
    zeroing the gradients, plus an AdamW step when ``lr`` is given."""
    if not train:
        model.eval()

        def step():
            with torch.no_grad():
                forward()

        return step
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr) if lr else None
    loss = loss or (lambda out: out.sum())

    def step():
        model.zero_grad(set_to_none=True)
        loss(forward()).backward()
        if opt is not None:
            opt.step()

    return step


def run_worker(spec: dict) -> dict:
    """Inside the fresh process: build and measure one case."""
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    import importlib

    suite = importlib.import_module(spec["suite"])
    case = spec["case"]
    torch.manual_seed(0)
    step = suite.build(case)
    result = measure(
        step,
        min_repeats=spec.get("min_repeats", 3),
        min_time=spec.get("min_time", 1.0),
        device=case.get("device", "cpu"),
    )
    extra = getattr(suite, "recorded", None)  # what the timed runs recorded beside their time (decode speed)
    if extra is not None:
        result.update(extra(case))
    flops = suite.flops(case)
    result["gflops"] = flops / result["seconds_min"] / 1e9 if flops else None
    result["threads"] = torch.get_num_threads()
    return result


def run_case(suite: str, case: dict, *, threads: int | None = None, timeout: float = 600, **opts) -> dict:
    """Run one case in a fresh process; a failure (e.g. out of memory) is recorded, not raised."""
    spec = {"suite": suite, "case": case, "threads": threads, **opts}
    proc = subprocess.run(
        [sys.executable, "-m", "multihead.bench.worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {**case, "error": f"exit {proc.returncode}: {tail[0]}"}
    return {**case, **json.loads(proc.stdout.strip().splitlines()[-1])}


def machine_info(threads: int | None, device: str = "cpu") -> dict:
    gpu = {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda} if device == "cuda" else {}
    return {
        **gpu,
        **cpu_model(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "threads": threads or torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def write_json(path: Path, payload: dict) -> None:
    atomic_write_json(path, payload)
