"""Where the head-aware cache (and multihead's best policy) stands against kvpress's best press, over every finished
block of one or more ``bench kv`` runs: a verdict per block (task, length, protocol) and kept fraction, and how many
cells fall under each verdict. Reads the JSON files only (no model).

A cell compares two methods at the same kept fraction, so the same bytes:

- ``ahead, apart`` / ``behind, apart``: their Wilson 95% intervals do not overlap;
- ``ahead`` / ``behind``: the intervals overlap, but question by question one scored higher on more questions and the
  sign test over the questions where they differ gives p < 0.05;
- ``level``: neither (where a run did not keep each question's score, only the intervals can tell them apart).

Blocks where the full cache scores below ``--floor`` (default 0.25) are tabled and counted apart: the model itself
rarely answers them, so they say little about the caches.

Rows of runs made before each question's score was kept can take them from a rerun (``--scores``: runs of the same
blocks under the same settings, any subset of the methods): a row takes the rerun's scores only where the rerun's row
answered as many questions and scored the same sum, and the script says how many rows it filled and which rerun rows
scored otherwise.

    python bench/kv_summary.py bench/results/kv-ruler-smollm2-2048-context.json \
        bench/results/kv-ruler-smollm2-2048-question.json bench/results/kv-ruler-smollm2-4096-context.json \
        [--scores RERUN.json,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

VERDICTS = ("ahead, apart", "ahead", "level", "behind", "behind, apart")
P = 0.05


def verdict(a: dict, b: dict) -> str:
    """``a`` against ``b`` (two rows of one block at one fraction): one of :data:`VERDICTS`."""
    from multihead.bench.kv import paired

    if a["interval"][0] > b["interval"][1]:
        return "ahead, apart"
    if b["interval"][0] > a["interval"][1]:
        return "behind, apart"
    pair = paired(a, b)
    if pair is not None and pair[2] < P and pair[0] != pair[1]:
        return "ahead" if pair[0] > pair[1] else "behind"
    return "level"


def fill_scores(payload: dict, reruns: list[dict]) -> tuple[int, list[str]]:
    """Each row of ``payload`` that kept no per-question scores takes a rerun's, where the rerun's row of the same
    block, side, method and fraction answered as many questions and scored the same sum (within the rounding of the
    kept scores). The rows filled, and the rerun rows that answered as many questions but scored otherwise."""
    from multihead.bench.kv import SCORE_PLACES

    def key(r):
        return (r["task"], r["length"], r["protocol"], r["side"], r["method"], r["fraction"])

    again = {key(r): r for p in reruns for r in p["results"] if r.get("scores") and r.get("questions")}
    filled, differ = 0, []
    for r in payload["results"]:
        other = again.get(key(r))
        if r.get("scores") or other is None or other["questions"] != r.get("questions"):
            continue
        rounding = len(other["scores"]) * 0.5 * 10**-SCORE_PLACES  # each kept score rounded to SCORE_PLACES
        if abs(sum(other["scores"]) - r["score_sum"]) <= rounding + 1e-9:
            r["scores"] = list(other["scores"])
            filled += 1
        else:
            differ.append(f"{'/'.join(map(str, key(r)))}: {r['score_sum']:.4f} against {sum(other['scores']):.4f}")
    return filled, differ


def _best(rows: list[dict]) -> dict | None:
    return max(rows, key=lambda r: (r["score"], r["interval"][0]), default=None)


def cells(payload: dict, floor: float = 0.25) -> list[dict]:
    """One dict per finished block and kept fraction: the full cache's score, the head-aware cache's, multihead's best
    policy's and kvpress's best press's, and the two verdicts against that press."""
    n = payload["config"]["n"]
    rows = [r for r in payload["results"] if r.get("questions")]
    out = []
    order = {t: i for i, t in enumerate(payload["config"].get("tasks", []))}
    blocks = sorted({(r["task"], r["length"], r["protocol"]) for r in rows}, key=lambda b: (order.get(b[0], 99), b))
    for block in blocks:
        if payload.get("done", {}).get("/".join(map(str, block)), 0) < n:
            continue  # still running
        cell = [r for r in rows if (r["task"], r["length"], r["protocol"]) == block]
        full = next((r for r in cell if r["method"] == "full" and r["side"] == "multihead"), None)
        for fraction in sorted({r["fraction"] for r in cell if r["fraction"] < 1}):
            here = [r for r in cell if r["fraction"] == fraction and r["method"] != "full"]
            press = _best([r for r in here if r["side"] == "kvpress"])
            ours = _best([r for r in here if r["side"] == "multihead"])
            aware = next((r for r in here if r["method"] == "head-aware"), None)
            if press is None or ours is None or full is None:
                continue
            out.append(
                {
                    "task": block[0],
                    "length": block[1],
                    "protocol": block[2],
                    "fraction": fraction,
                    "full": full["score"],
                    "answered": full["score"] >= floor,
                    "press": (press["method"], press["score"]),
                    "ours": (ours["method"], ours["score"]),
                    "head_aware": None if aware is None else aware["score"],
                    "head_aware_verdict": None if aware is None else verdict(aware, press),
                    "best_verdict": verdict(ours, press),
                }
            )
    return out


def table(all_cells: list[dict]) -> str:
    """The verdicts as a markdown page: one row per block and fraction, the counts under each table; the blocks where
    the full cache scores below the floor in a table of their own."""
    lines: list[str] = []
    for answered, title in ((True, None), (False, "Where the full cache scores below the floor")):
        mine = [c for c in all_cells if c["answered"] == answered]
        if not mine:
            continue
        if title:
            lines += ["", f"{title}:", ""]
        lines += [
            "| task | length | protocol | full cache | kept | head-aware | multihead's best | kvpress's best | "
            "head-aware against it | multihead's best against it |",
            "|---|---:|---|---:|---:|---:|---|---|---|---|",
        ]
        for c in mine:
            aware = "" if c["head_aware"] is None else f"{c['head_aware']:.2f}"
            lines.append(
                f"| {c['task']} | {c['length']} | {c['protocol']} | {c['full']:.2f} | {c['fraction']:g} | {aware} | "
                f"{c['ours'][0]} {c['ours'][1]:.2f} | {c['press'][0]} {c['press'][1]:.2f} | "
                f"{c['head_aware_verdict'] or ''} | {c['best_verdict']} |"
            )
        for key, name in (("head_aware_verdict", "The head-aware cache"), ("best_verdict", "multihead's best policy")):
            counts = Counter(c[key] for c in mine if c[key] is not None)
            lines += [
                "",
                f"{name} against kvpress's best press, {sum(counts.values())} cells: "
                + ", ".join(f"{v} {counts.get(v, 0)}" for v in VERDICTS),
            ]
    return "\n".join(lines).lstrip("\n") + "\n"


def _read(path: Path) -> dict:
    """A bench kv JSON; ValueError naming the file where it is not one."""
    try:
        p = json.loads(path.read_text())
        if p.get("suite") != "kv" or not isinstance(p.get("results"), list):
            raise ValueError("no bench kv results")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path} is not a bench kv JSON ({exc}); give files `multihead bench kv` wrote") from None
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="bench kv JSON files")
    ap.add_argument(
        "--floor", type=float, default=0.25, help="table apart the blocks whose full cache scores below this"
    )
    ap.add_argument("--scores", default="", help="reruns that kept each question's score, comma-separated JSON files")
    args = ap.parse_args(argv)
    if not 0 <= args.floor <= 1:
        print(f"--floor is a score in [0, 1], got {args.floor}", file=sys.stderr)
        return 2
    try:
        payloads = [_read(path) for path in args.runs]
        reruns = [_read(Path(x)) for x in args.scores.split(",") if x]
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    notes = []
    for path, p in zip(args.runs, payloads) if reruns else []:
        filled, differ = fill_scores(p, reruns)
        notes += [f"{path.name}: {filled} rows took each question's score from a rerun"]
        notes += [f"a rerun scored otherwise: {d}" for d in differ]
    print(table([c for p in payloads for c in cells(p, args.floor)]), end="")
    for note in notes:
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
