"""Helpers for the hostile-input suite: run the real CLI in a subprocess, check that bad input gets a clear message
(exit 2, ``error: ...``, never a Python traceback), and that files that existed before are byte-identical after."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args, cwd=None, env=None, timeout=600, check_no_traceback=True, subprocess_=False):
    """Run ``multihead ARGS``. In-process by default (``cli.main``, the same entry point the console script calls:
    output captured, process state restored); ``subprocess_=True`` runs the real command in a fresh interpreter.
    Either way the result has ``returncode``, ``stdout`` and ``stderr``; an exception escaping ``main`` is recorded as
    a traceback in ``stderr`` (and fails the no-traceback check)."""
    if subprocess_:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("MULTIHEAD_DEBUG", None)
        proc = subprocess.run(
            [sys.executable, "-m", "multihead.cli", *map(str, args)],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            errors="replace",
        )
    else:
        proc = _in_process([str(a) for a in args], cwd=cwd, env=env)
    if check_no_traceback:
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def _in_process(argv: list[str], *, cwd=None, env=None) -> subprocess.CompletedProcess:
    import contextlib
    import io
    import traceback

    import torch

    from multihead import cli

    out, err = io.StringIO(), io.StringIO()
    threads, old_cwd = torch.get_num_threads(), os.getcwd()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    os.environ.pop("MULTIHEAD_DEBUG", None)
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 2
            except BaseException:  # what a user would have seen: a traceback
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(old_cwd)
        torch.set_num_threads(threads)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["multihead", *argv], code, out.getvalue(), err.getvalue())


def refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Assert a clean refusal: exit status 2, an ``error:`` line naming each fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    assert "error:" in proc.stderr, proc.stderr
    for f in fragments:
        assert f.lower() in proc.stderr.lower(), (f, proc.stderr)
    return proc.stderr


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> sha256 of its bytes)."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def tiny_train_args(data: Path, out: Path, *extra) -> list:
    return [
        "train",
        "--data",
        data,
        "--text-column",
        "sentence",
        "--label-column",
        "sentiment",
        "--out",
        out,
        "--epochs",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "2",
        "--d-ff",
        "32",
        "--vocab-size",
        "300",
        "--no-progress",
        "--threads",
        "1",
        *extra,
    ]
