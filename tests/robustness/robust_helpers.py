"""Helpers for the hostile-input suite: run the real CLI in a subprocess, check that bad input gets a clear message
(exit 2, ``error: ...``, never a Python traceback), and that files that existed before are byte-identical after."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path



def run_cli(*args, cwd=None, env=None, timeout=600, check_no_traceback=True) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("MULTIHEAD_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "multihead.cli", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, errors="replace")
    if check_no_traceback:
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Assert a clean refusal: exit status 2, an ``error:`` line naming each fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error:") or "\nerror:" in proc.stderr or "error:" in proc.stderr, proc.stderr
    for f in fragments:
        assert f.lower() in proc.stderr.lower(), (f, proc.stderr)
    return proc.stderr


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> sha256 of its bytes)."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_train_args(data: Path, out: Path, *extra) -> list:
    return ["train", "--data", data, "--text-column", "sentence", "--label-column", "sentiment", "--out", out,
            "--epochs", "1", "--d-model", "16", "--heads", "2", "--layers", "2", "--d-ff", "32",
            "--vocab-size", "300", "--no-progress", "--threads", "1", *extra]


