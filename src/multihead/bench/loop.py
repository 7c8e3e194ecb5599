"""``multihead bench loop``: what a user waits for, cold and warm.

**Cold**: each command in a fresh process, as typed in a shell (wall time of the whole process, best and median of
``repeats``): ``--help``, a usage error, a missing source, a layer the model's header rules out, ``show`` and
``explain`` on the cat sentence. **Warm**: the same work where the model stays loaded, the loop a notebook or
``explain --serve`` gives: the model loaded once, then ``explain`` and ``show`` on three texts each, then the same
three texts asked of ``explain --serve`` over HTTP. The JSON is written after every case, so a stopped run keeps
what it measured.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "multihead.bench.loop"
TEXTS = ("The cat sat on the mat.", "A dog ran into the big red house.", "My old friend wrote a long letter.")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "multihead", *args]


def cold_cases(model: str, scratch: Path) -> dict[str, list[str]]:
    """Each case: the command line of one fresh process."""
    return {
        "--help": _cli("--help"),
        "usage error (heads)": _cli("heads"),
        "refusal: missing source": _cli("generate", str(scratch / "no-such-model"), "hi"),
        "refusal: --layer 999 (header)": _cli(
            "explain", TEXTS[0], "--model", model, "--layer", "999", "--out", str(scratch / "x")
        ),
        "show (cat sentence)": _cli("show", model, TEXTS[0], "--out", str(scratch / "show"), "--overwrite"),
        "explain (cat sentence)": _cli(
            "explain", TEXTS[0], "--model", model, "--out", str(scratch / "ex"), "--overwrite"
        ),
    }


def _time(cmd: list[str], threads: int) -> tuple[float, int]:
    import os

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    return time.perf_counter() - start, done.returncode


def warm(model: str, scratch: Path, threads: int) -> dict:
    """The model loaded once in this process; then explain, show and the served page on :data:`TEXTS`."""
    import urllib.request

    import torch

    from ..interpret import load_subject
    from ..interpret.pages.explain import explain
    from ..interpret.pages.serve import Explainer, Server
    from ..interpret.pages.show import show

    torch.set_num_threads(threads)
    start = time.perf_counter()
    subject = load_subject(model)
    out = {"load": time.perf_counter() - start, "explain": [], "show": [], "served": []}
    for text in TEXTS:
        start = time.perf_counter()
        explain(subject, text)
        out["explain"].append(time.perf_counter() - start)
    for i, text in enumerate(TEXTS):
        start = time.perf_counter()
        show(subject, text, scratch / f"warm-show-{i}", overwrite=True, log=lambda *_: None)
        out["show"].append(time.perf_counter() - start)
    server = Server(Explainer(subject), TEXTS[0]).start()
    try:
        for text in TEXTS:
            body = json.dumps({"text": text, "layer": None}).encode()
            req = urllib.request.Request(server.url + "api/explain", data=body, method="POST")
            req.add_header("content-type", "application/json")
            start = time.perf_counter()
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
            out["served"].append(time.perf_counter() - start)
    finally:
        server.stop()
    return out


def run(model: str = "smollm2", repeats: int = 3, threads: int | None = None, out: Path | None = None) -> dict:
    from tqdm import tqdm

    from .harness import machine_info, write_json

    from ..loading import kind

    kind(model).check("show")  # a source that is not there, or that show does not take: refused before any case runs
    threads = threads or 2
    payload: dict = {"suite": "loop", "model": model, "machine": machine_info(threads), "cold": {}, "warm": None}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        cases = cold_cases(model, scratch)
        for name, cmd in tqdm(cases.items(), desc="cold commands", unit="case"):
            times, codes = [], set()
            for _ in range(repeats):
                seconds, code = _time(cmd, threads)
                times.append(seconds)
                codes.add(code)
            payload["cold"][name] = {
                "command": " ".join(["multihead", *cmd[3:]]).replace(str(scratch), "TMP"),
                "best": min(times),
                "median": statistics.median(times),
                "exit": sorted(codes),
            }
            if out is not None:
                write_json(out, payload)
        payload["warm"] = warm(model, scratch, threads)
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    lines = [f"{payload['model']}: cold (a fresh process each) and warm (the model kept loaded), seconds"]
    lines.append(f"{'cold':<34}{'best':>8}{'median':>8}  exit")
    for name, r in payload["cold"].items():
        lines.append(f"{name:<34}{r['best']:>8.2f}{r['median']:>8.2f}  {','.join(map(str, r['exit']))}")
    w = payload.get("warm")
    if w:
        lines.append(f"warm: model loaded once in {w['load']:.2f} s, then per text:")
        for key in ("explain", "show", "served"):
            label = {"served": "explain --serve (HTTP)"}.get(key, key)
            lines.append(f"  {label:<32}" + "  ".join(f"{t:.2f}" for t in w[key]))
        cold = payload["cold"].get("show (cat sentence)")
        if cold:
            lines.append(
                f"show: cold {cold['best']:.2f} s, warm {min(w['show']):.2f} s ({cold['best'] / min(w['show']):.0f}x)"
            )
        cold = payload["cold"].get("explain (cat sentence)")
        if cold:
            lines.append(
                f"explain: cold {cold['best']:.2f} s, warm {min(w['explain']):.2f} s, served "
                f"{min(w['served']):.2f} s ({cold['best'] / min(w['served']):.0f}x)"
            )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"loop-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench loop --model MODEL`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(model=args.model or "smollm2", threads=args.threads, out=out)
