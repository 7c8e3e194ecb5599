"""This process's memory counters from ``/proc/self/status`` (Linux), its threads, and the CPU it runs on (the model
name and the vector extensions that decide which kernel is fastest); used by the bench harness, the trainer and the
decoding kernels' choice."""

from __future__ import annotations

import platform
import re
from pathlib import Path


def status_kib(field: str, pid: int | str = "self") -> int:
    """A ``/proc/<pid>/status`` field in KiB (this process by default), e.g. ``VmHWM`` (peak resident) or
    ``VmRSS``; 0 when unavailable."""
    try:
        m = re.search(rf"{field}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


def max_threads() -> int:
    """The most CPU threads a command may ask for: four per CPU. More only slow PyTorch's kernels down, and
    thousands exhaust the memory their stacks reserve."""
    import os

    return 4 * (os.cpu_count() or 1)


def set_threads(n: int | None) -> None:
    """Use ``n`` CPU threads for PyTorch's kernels (``--threads``); None leaves PyTorch's choice. More than
    :func:`max_threads` is refused (``ValueError``) before any thread is made."""
    if n:
        import torch

        if n > max_threads():
            raise ValueError(
                f"{n} threads asked for, on a machine with {max_threads() // 4} CPUs; more than {max_threads()} only "
                f"slow it down (and thousands exhaust memory): pass --threads {max_threads() // 4} or fewer"
            )
        torch.set_num_threads(n)


def cpu_model() -> dict:
    """The CPU's model name and the vector extensions that decide which kernel is fastest on it (a speed measured
    on one CPU is a claim about that CPU): from ``/proc/cpuinfo`` where there is one."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {"cpu": platform.processor() or platform.machine()}
    fields = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()[:64]) if v)
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {"cpu": fields.get("model name", platform.processor()), "cpu_flags": [f for f in wanted if f in flags]}
