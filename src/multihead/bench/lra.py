"""``multihead bench lra``: a Long-Range-Arena-style comparison on real long text.

The default from-scratch classifier is trained on IMDB reviews at ``max_len`` tokens (1,024 by default; LRA's text
task uses byte-level 4k) once per attention variant, each in its own process: dense (exact, SDPA), sliding window,
BigBird block-sparse, Performer, elu linear attention. Reported: test accuracy, seconds per epoch, peak resident
memory of the whole training process. Tay et al. 2020 (LRA) is the published reference for how the families
compare: on text, sparse and linear variants land within a few points of the dense Transformer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "dense": [],
    "window": ["--set", 'model.encoder.pattern={"window": 128}'],
    "block_sparse": ["--set", 'model.encoder.pattern={"block": 64, "random_blocks": 1}'],
    "performer": ["--backend", "performer"],
    "linear_elu": ["--backend", "linear_elu"],
}


def run(
    out_dir: Path,
    *,
    data: str = "imdb",
    max_len: int = 1024,
    epochs: int = 3,
    limit: int | None = None,
    variants=None,
    threads: int | None = None,
    extra=(),
    log=print,
) -> dict:
    rows = []
    for name in variants or VARIANTS:
        folder = out_dir / name
        cmd = [
            sys.executable,
            "-m",
            "multihead.cli",
            "train",
            "--data",
            data,
            "--max-len",
            str(max_len),
            "--epochs",
            str(epochs),
            "--out",
            str(folder),
            "--overwrite",
            "--no-progress",
            *VARIANTS[name],
            *extra,
        ]
        if limit:
            cmd += ["--limit", str(limit)]
        if threads:
            cmd += ["--threads", str(threads)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            rows.append({"variant": name, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]})
            log(f"{name}: failed: {rows[-1]['error']}")
            continue
        r = json.loads((folder / "results.json").read_text())
        evals = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        epoch_s = [e["epoch_seconds"] for e in evals if e.get("event") == "eval"]
        rows.append(
            {
                "variant": name,
                "test_accuracy": r["test"]["accuracy"],
                "macro_f1": r["test"]["macro_f1"],
                "best_epoch": r["best_epoch"],
                "seconds_per_epoch": sum(epoch_s) / len(epoch_s),
                "peak_rss_mb": r.get("peak_rss_mb"),
                "parameters": r["parameters"],
                "truncated_test": r["truncated"]["test"],
                "wall_seconds": time.perf_counter() - t0,
                "threads": r["threads"],
            }
        )
        log(
            f"{name}: test accuracy {r['test']['accuracy']:.4f}, {rows[-1]['seconds_per_epoch']:.0f}s/epoch, "
            f"peak {rows[-1]['peak_rss_mb']:.0f} MiB"
        )
    payload = {"suite": "lra", "data": data, "max_len": max_len, "epochs": epochs, "limit": limit, "rows": rows}
    return payload


def format_table(payload: dict) -> str:
    lines = [
        f"{payload['data']} at max_len {payload['max_len']}, {payload['epochs']} epochs"
        + (f", {payload['limit']} examples per split" if payload["limit"] else ""),
        f"{'variant':<14}{'test acc':>9}{'s/epoch':>9}{'peak MiB':>10}",
    ]
    for r in payload["rows"]:
        if "error" in r:
            lines.append(f"{r['variant']:<14} {r['error']}")
        else:
            lines.append(
                f"{r['variant']:<14}{r['test_accuracy']:>9.4f}{r['seconds_per_epoch']:>9.0f}{r['peak_rss_mb']:>10.0f}"
            )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results/lra.json")


def from_args(args, out: Path) -> dict:
    """``multihead bench lra`` (the suite protocol in :mod:`multihead.bench`): trains into ``--runs``."""
    from .._io import atomic_write_json

    payload = run(
        Path(args.runs),
        max_len=args.max_len,
        epochs=args.epochs,
        limit=args.limit,
        variants=args.impls,
        threads=args.threads,
    )
    atomic_write_json(out, payload)
    return payload
