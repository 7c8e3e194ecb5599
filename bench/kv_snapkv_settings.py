"""SnapKV with its paper's settings against kvpress's, on SmolLM2-135M: is a gap between multihead's SnapKV and
kvpress's SnapKVPress the settings, or something else?

The two compute the same score (the attention the prompt's last ``window`` queries give each earlier key, pooled over
``kernel`` neighbours, reduced over each key/value head's query heads, the last ``window`` keys always kept) with
different defaults: multihead's are the paper's (window 32, kernel 7), kvpress's window 64 and kernel 5. This study
reads each sample once, as ``bench kv`` reads it (the same task, length, seed and protocol, so the same token ids),
and answers from SnapKV under each ``--settings`` pair at each fraction. Given ``--grid`` (a ``bench kv`` JSON of the
same cells), each setting is paired question by question with that run's rows: the first setting, ``bench kv``'s,
should give its ``snapkv`` scores exactly, and each is compared with ``SnapKVPress`` (kvpress's settings, its scores
exactly where the two compute the same).

    python bench/kv_snapkv_settings.py [--task fwe] [--protocol question] [--n 50] [--length 2048]
        [--fractions 0.125,0.25,0.5] [--settings 32:7,64:5 (window:kernel)]
        [--grid bench/results/kv-ruler-smollm2-2048-question.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm


def settings(text: str) -> list[tuple[int, int]]:
    """``window:kernel`` pairs, comma-separated; ValueError naming the flag where one does not parse."""
    try:
        pairs = [tuple(int(x) for x in part.split(":")) for part in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or p[0] < 1 or p[1] < 1 or p[1] % 2 == 0 for p in pairs):
        raise ValueError(
            f"--settings is a comma-separated list of window:kernel pairs (a window of at least 1 query, an odd "
            f"kernel), got {text!r}"
        )
    return [(w, k) for w, k in pairs]


def grid_scores(path: Path, task: str, length: int, protocol: str) -> dict[tuple[str, float], list[float]]:
    """``(method, fraction) -> scores`` of a ``bench kv`` JSON's rows for one cell; ValueError naming the fix."""
    try:
        rows = json.loads(path.read_text())["results"]
        return {
            (r["method"], r["fraction"]): r["scores"]
            for r in rows
            if r["task"] == task and r["length"] == length and r["protocol"] == protocol and r.get("scores")
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"--grid {path}: not a bench kv JSON ({type(exc).__name__}: {exc}); give the file `multihead bench kv "
            "--out` writes"
        ) from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="fwe")
    ap.add_argument("--protocol", default="question")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--fractions", default="0.125,0.25,0.5")
    ap.add_argument("--settings", default="32:7,64:5", help="window:kernel pairs; the first is bench kv's")
    ap.add_argument("--grid", type=Path, help="a bench kv JSON of the same cells, to pair with")
    ap.add_argument(
        "--out", type=Path, help="default: bench/results/kv-snapkv-settings-smollm2-TASK-LENGTH-PROTOCOL.json"
    )
    args = ap.parse_args(argv)
    out = args.out or Path(f"bench/results/kv-snapkv-settings-smollm2-{args.task}-{args.length}-{args.protocol}.json")
    from multihead.bench.kv import check_study, numbers

    try:  # refused before any model is read, as bench kv refuses
        fractions = numbers(args.fractions, "--fractions")
        pairs = settings(args.settings)
        check_study(
            task=args.task,
            length=args.length,
            n=args.n,
            fractions=fractions,
            methods=["snapkv"],
            protocol=args.protocol,
        )
        grid = grid_scores(args.grid, args.task, args.length, args.protocol) if args.grid else {}
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2

    from multihead._io import file_lock
    from multihead.bench.harness import machine_info, write_json
    from multihead.bench.kv import SCORE_PLACES, OursSide, reads_of, sign_test, smollm2_folder
    from multihead.data.ruler import samples_for, score
    from multihead.modules.kv import make_policy

    side = OursSide(smollm2_folder(), methods=["snapkv"])
    samples = samples_for(side.lm, args.task, length=args.length, count=args.n, seed=0)
    names = {(w, k): f"snapkv, window {w}, kernel {k}" for w, k in pairs}
    scores: dict[tuple[str, float], list[float]] = {(n, f): [] for n in names.values() for f in fractions}
    for s in tqdm(samples, desc=f"SnapKV settings on {args.task}"):
        for context, questions in reads_of(s, args.protocol):  # as bench kv reads the sample
            read = side.read(context, record=[make_policy("snapkv", 1, window=w) for w, _ in pairs])
            for f in fractions:
                for (w, k), name in names.items():
                    policy = make_policy("snapkv", side.budget.keys(f, read["length"]), window=w, kernel=k)
                    for ids, q in questions:
                        answer, *_ = side.answer({"read": read, "policy": policy}, ids, q.max_new_tokens)
                        scores[(name, f)].append(round(score(answer, q.answers), SCORE_PLACES))  # as bench kv

    def paired(mine: list[float], theirs: list[float] | None):
        return sign_test(mine, theirs) if theirs is not None and len(theirs) == len(mine) else None

    cells = []
    for f in fractions:
        for name in names.values():
            v = scores[(name, f)]
            cells.append(
                {
                    "setting": name,
                    "fraction": f,
                    "score": round(sum(v) / len(v), 4),
                    "scores": v,
                    "same_as_grid_snapkv": v == grid.get(("snapkv", f)) if grid else None,
                    "against_grid_snapkv": paired(v, grid.get(("snapkv", f))),
                    "against_grid_SnapKVPress": paired(v, grid.get(("SnapKVPress", f))),
                    "same_as_grid_SnapKVPress": v == grid.get(("SnapKVPress", f)) if grid else None,
                }
            )
    result = {
        "study": "SnapKV: the paper's settings against kvpress's",
        "model": str(smollm2_folder()),
        "task": args.task,
        "protocol": args.protocol,
        "length": args.length,
        "n": args.n,
        "seed": 0,
        "grid": str(args.grid) if args.grid else None,
        "grid_scores": {
            f"{m} {f:g}": round(sum(v) / len(v), 4)
            for (m, f), v in grid.items()
            if m in ("snapkv", "SnapKVPress") and f in fractions
        },
        "machine": machine_info(None),
        "cells": cells,
    }
    with file_lock(out):  # two studies writing one file would lose one
        write_json(out, result)
    for c in cells:
        print(
            f"{c['fraction']:<6g} {c['setting']:32s} {c['score']:.2f}   same as the grid's snapkv: "
            f"{c['same_as_grid_snapkv']}, as its SnapKVPress: {c['same_as_grid_SnapKVPress']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
