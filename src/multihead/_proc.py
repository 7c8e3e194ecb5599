"""This process's memory counters from ``/proc/self/status`` (Linux); used by the bench harness and the trainer."""

from __future__ import annotations

import re
from pathlib import Path


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB, e.g. ``VmHWM`` (peak resident) or ``VmRSS``; 0 when unavailable."""
    try:
        m = re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text())
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


def set_threads(n: int | None) -> None:
    """Use ``n`` CPU threads for PyTorch's kernels (``--threads``); None leaves PyTorch's choice."""
    if n:
        import torch

        torch.set_num_threads(n)
