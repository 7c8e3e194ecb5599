"""Behaviour kept between two versions: a short seeded run of every training task, its metrics and final weights.

    python bench/metrics_parity.py run OUT          # runs every task with the multihead on PYTHONPATH, into OUT/
    python bench/metrics_parity.py compare A B      # compares two such folders: metrics.jsonl without clock fields,
                                                    # and every weight tensor of the final checkpoint

Each run is small (seconds to a minute on 2 cores) and long enough for 50+ optimizer steps.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLOCK = {"minutes", "epoch_seconds", "tokens_per_second", "seconds", "threads"}
TEXT = ["--d-model", "32", "--heads", "4", "--layers", "1", "--d-ff", "64", "--threads", "1", "--no-progress"]
RUNS = {
    "classifier": ["train", "--data", "rotten_tomatoes", "--limit", "1700", "--epochs", "2", "--max-len", "48",
                   "--vocab-size", "800", *TEXT],
    "mlm": ["pretrain", "--objective", "mlm", "--data", "imdb", "--limit", "300", "--steps", "60", "--eval-every", "30",
            "--seq-len", "64", "--vocab-size", "800", "--batch-size", "8", *TEXT],
    "clm": ["pretrain", "--objective", "clm", "--data", "imdb", "--limit", "300", "--steps", "60", "--eval-every", "30",
            "--seq-len", "64", "--vocab-size", "800", "--batch-size", "8", *TEXT],
    "clm-variants": ["pretrain", "--objective", "clm", "--data", "imdb", "--limit", "300", "--steps", "60",
                     "--eval-every", "30", "--seq-len", "64", "--vocab-size", "800", "--batch-size", "8", "--set",
                     "causal.positional=alibi", "--set", "causal.decoder.sinks=true", "--set", "causal.decoder.gate=true",
                     *TEXT],
    "g2p": ["train", "--data", "cmudict", "--limit", "3000", "--epochs", "2", "--batch-size", "64", "--set",
            "run.eval_words=40", "--set", "run.beam=2", "--d-model", "32", "--heads", "2", "--layers", "1", "--d-ff",
            "64", "--threads", "1", "--no-progress"],
    "vit": ["train", "--data", "digits", "--epochs", "3", "--d-model", "32", "--heads", "4", "--layers", "2", "--set",
            "model.encoder.d_ff=64", "--set", "model.patch_size=2", "--set", "model.stem_channels=16",
            "--batch-size", "64", "--lr", "3e-3", "--threads", "1", "--no-progress", "--set", "run.baseline=false"],
    "grounding": ["train", "--data", "digits_qa", "--epochs", "7", "--d-model", "16", "--heads", "2", "--layers", "1",
                  "--set", "model.text.d_ff=32", "--set", "model.vision.encoder.d_model=24", "--set",
                  "model.vision.encoder.num_layers=1", "--set", "data.canvases=512", "--set", "data.validation=64",
                  "--set", "data.test=200", "--batch-size", "64", "--threads", "1", "--no-progress"],
}


def run(out: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS.items():
        if only and name not in only:
            continue
        proc = subprocess.run([sys.executable, "-m", "multihead.cli", *args, "--out", str(out / name)],
                              capture_output=True, text=True)
        print(f"{name}: rc {proc.returncode}", proc.stderr[-2000:] if proc.returncode else "")


def _events(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in CLOCK}
            for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    state = json.loads((path / "checkpoint" / "state.json").read_text())
    return {k: v for k, v in load_file(path / "checkpoint" / state["file"]).items() if k.startswith("model.")}


def compare(a: Path, b: Path) -> int:
    """Events are matched by (event, step); values of the keys both sides have must be equal to the bit. Events or
    keys that only one side has are listed (a deliberate change of what is logged, not of what is computed)."""
    bad = 0
    for name in RUNS:
        if not (a / name).exists() or not (b / name).exists():
            continue
        ea = {(e["event"], e.get("step")): e for e in _events(a / name)}
        eb = {(e["event"], e.get("step")): e for e in _events(b / name)}
        worst, notes = 0.0, []
        for key in sorted(set(ea) | set(eb), key=lambda k: (k[1] or 0, k[0])):
            if key not in eb or key not in ea:
                notes.append(f"{key[0]} event at step {key[1]} only {'before' if key in ea else 'after'}")
                continue
            x, y = ea[key], eb[key]
            for k in sorted(set(x) ^ set(y)):
                notes.append(f"{key[0]}@{key[1]}: key {k!r} only {'before' if k in x else 'after'}")
            for k in set(x) & set(y):
                if isinstance(x[k], float) and isinstance(y[k], float):
                    worst = max(worst, abs(x[k] - y[k]))
                elif x[k] != y[k]:
                    worst = float("inf")
        wa, wb = _weights(a / name), _weights(b / name)
        wdiff = max(((wa[k] - wb[k]).abs().max().item() for k in wa if k in wb), default=float("inf")) \
            if wa.keys() == wb.keys() else float("inf")
        steps = max((k[1] or 0 for k in ea), default=0)
        ok = worst == 0 and wdiff == 0
        bad += not ok
        print(f"{name:10s} {len(ea)} events to step {steps}: max |metric diff| {worst:.3g}, max |weight diff| "
              f"{wdiff:.3g}  {'bit-identical' if ok else 'DIFFERENT'}")
        for n in sorted(set(notes)):
            print(f"    {n}")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]), sys.argv[3:])
    else:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
