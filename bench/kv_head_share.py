"""Where the head-aware cache finds the needle, and how many whole heads it needs, on SmolLM2-135M.

``bench kv`` keeps ``fraction / 2`` of the key/value heads whole (by the data-free ranking) and gives the others a
window sized so that the bytes match. At 4k and a quarter of the bytes it scores about what a plain window scores.
This study reads each sample once (the same samples as ``bench kv``: same task, length and seed; a needle task,
``--task``; ``--seed 1`` and up draw samples ``bench kv`` never ran, to check a finding on text it was not found on)
and answers from:

- the head-aware cache with ``share`` of the key/value heads whole, for several shares at the same bytes (more whole
  heads, shorter windows for the others);
- a plain window of the same bytes; the full cache.

Each answer is scored as ``bench kv`` scores it, and the needles are grouped by where they lie in the text (the
share of the text before them), so that one sees whether a cache answers needles outside the part its windows hold.
A needle is one value the answer must hold: one per question for a single needle or multi-key, four for multi-value
(one key's four values) and multi-query (four keys asked); each is counted found or not, and a question scores the
share it finds. A missed needle whose first characters the answer holds, then something else, is counted as a
partial copy: the cache found the needle and lost the rest of it.
It also says which of the key/value heads that ``heads --kv`` found retrieving (``--kv-heads``, a kv-heads.json) each
share keeps whole.

The budgets are fractions of ``--length``; ``bench kv`` takes them of each context's own tokens (the question
aside, about 1% fewer), so at equal fractions this study's caches hold about 1% more keys than the grid's.

    python bench/kv_head_share.py [--task niah_single_number] [--seed 0] [--n 50] [--length 4096] [--fraction 0.25]
        [--shares 0.0625,0.125,0.1875 (a quarter, a half, three quarters of the fraction)]
        [--kv-heads bench/results/kv-heads-smollm2-fitted.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm


def _retrieving(path: Path) -> list[tuple[int, int]]:
    """The (layer, key/value head) pairs holding a query head that a kv-heads.json names as retrieving. ValueError,
    naming the fix, for a file that is missing or is not a kv-heads.json."""
    try:
        data = json.loads(path.read_text())
        heads = {(h["layer"], h["head"]): h["kv_head"] for h in data["heads"]}
        named = [r[1:].split("H") for r in data["retrieval_heads"]]
        return sorted({(int(layer), heads[(int(layer), int(head))]) for layer, head in named})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"--kv-heads {path}: not a kv-heads.json ({type(exc).__name__}: {exc}); give the file "
            "`multihead heads MODEL --kv` writes"
        ) from None


# a wrong answer holding at least this share of the needle's start began to copy it: a quarter of a 7-digit number
# is 2 digits (1 in 100 by chance), of a UUID 9 hexadecimal characters (1 in 16**9)
PARTIAL = 0.25
# the tasks whose expected strings are needles hidden in the text (one question each)
NEEDLES = (
    "niah_single_number",
    "niah_single_word",
    "niah_single_uuid",
    "niah_multikey",
    "niah_multivalue",
    "niah_multiquery",
)


def found(answer: str, text: str, expected) -> list[tuple[float, bool]]:
    """For each expected string: where it lies in ``text`` (the share of the text before it) and whether ``answer``
    holds it (case-insensitive, as RULER's ``string_match_all``: their mean is the question's score)."""
    said = answer.lower()
    return [(text.find(e) / len(text), e.lower() in said) for e in expected]


def copied(answer: str, needle: str) -> int:
    """How many of the needle's first characters the answer holds, in order (the whole needle: its length)."""
    k = 0
    while k < len(needle) and needle[: k + 1] in answer:
        k += 1
    return k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="niah_single_number", choices=NEEDLES)
    ap.add_argument("--seed", type=int, default=0, help="0: bench kv's samples")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--shares", help="default: a quarter, a half and three quarters of --fraction")
    ap.add_argument("--kv-heads", type=Path, default=Path("bench/results/kv-heads-smollm2-fitted.json"))
    ap.add_argument(
        "--out", type=Path, help="default: bench/results/kv-head-share-smollm2-[TASK-][seedS-]LENGTH[-fF].json"
    )
    args = ap.parse_args(argv)
    named = "" if args.task == "niah_single_number" else f"{args.task}-"  # the first study's files keep their names
    named += "" if args.seed == 0 else f"seed{args.seed}-"
    named += str(args.length) + ("" if args.fraction == 0.25 else f"-f{args.fraction:g}")
    out = args.out or Path(f"bench/results/kv-head-share-smollm2-{named}.json")
    from multihead.bench.kv import check_study, numbers

    try:  # refused before any model is read, as bench kv refuses
        shares = (
            numbers(args.shares, "--shares")
            if args.shares is not None
            else [args.fraction * q for q in (0.25, 0.5, 0.75)]
        )
        check_study(
            task=args.task,
            length=args.length,
            n=args.n,
            fractions=[args.fraction],
            methods=["full", "window", "head-aware"],
        )
        if not all(0 < s < args.fraction for s in shares):
            raise ValueError(f"--shares are shares of the key/value heads in (0, --fraction), got {args.shares}")
        retrieving = _retrieving(args.kv_heads)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2

    from multihead._io import file_lock
    from multihead.bench.harness import machine_info, write_json
    from multihead.bench.kv import OursSide, sign_test, smollm2_folder
    from multihead.data.ruler import samples_for, score
    from multihead.modules.kv import head_aware_at, make_policy

    side = OursSide(smollm2_folder(), methods=["full", "window", "head-aware"])
    samples = samples_for(side.lm, args.task, length=args.length, count=args.n, seed=args.seed)
    names = ["full", "window", *(f"head-aware, {s:g} of the heads whole" for s in shares)]
    scores: dict[str, list[float]] = {n: [] for n in names}
    hits: dict[str, list[float]] = {n: [] for n in names}  # one per needle: found (1) or not
    partial: dict[str, list[float]] = {n: [] for n in names}  # the share of a missed needle the answer begins with
    depths: list[float] = []  # one per needle
    for s in tqdm(samples, desc="head-aware: whole heads and windows"):
        q = s.questions[0]
        text = side.lm.decode(s.ids)
        depths += [d for d, _ in found("", text, q.answers)]
        read = side.read(s.ids)
        policies = [make_policy("full"), make_policy("window", round(args.fraction * args.length))]
        policies += [head_aware_at(args.fraction, args.length, side.split(sh), side.kv_heads) for sh in shares]
        for name, policy in zip(names, policies):
            answer, *_ = side.answer({"read": read, "policy": policy}, q.ids, q.max_new_tokens)
            scores[name].append(score(answer, q.answers))
            for e, (_, hit) in zip(q.answers, found(answer, text, q.answers)):
                hits[name].append(float(hit))
                if not hit:
                    partial[name].append(copied(answer, e) / len(e))

    bins = [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01)]

    def by_depth(xs: list[float]) -> dict:
        out = {}
        for lo, hi in bins:
            got = [x for x, d in zip(xs, depths) if lo <= d < hi]
            out[f"{lo:g}-{min(hi, 1):g}"] = {"needles": len(got), "answered": sum(got)}
        return out

    splits = {}
    for sh in shares:
        whole = {(layer, h) for layer, hs in enumerate(side.split(sh)) for h in hs}
        splits[f"{sh:g}"] = {"whole_kv_heads": len(whole), "retrieving_kept_whole": len(whole & set(retrieving))}
    result = {
        "study": "head-aware: whole heads and windows",
        "model": str(smollm2_folder()),
        "task": args.task,
        "length": args.length,
        "fraction": args.fraction,
        "n": args.n,
        "needles_per_question": len(samples[0].questions[0].answers),
        "seed": args.seed,
        "machine": machine_info(None),
        "retrieving_kv_heads": {"from": str(args.kv_heads), "count": len(retrieving)},
        "splits": splits,
        "caches": {
            n: {
                "score": round(sum(v) / len(v), 4),
                "by_depth": by_depth(hits[n]),
                "found": hits[n],  # one per needle, beside "depths"
                "scores": v,
                "wrong": len(partial[n]),  # needles missed (with one needle a question: wrong answers)
                "wrong_beginning_the_needle": sum(c >= PARTIAL for c in partial[n]),
                "wrong_copied_share_mean": round(sum(partial[n]) / len(partial[n]), 4) if partial[n] else None,
            }
            for n, v in scores.items()
        },
        "paired_against_window": {n: sign_test(scores[n], scores["window"]) for n in names[2:]},
        "depths": [round(d, 4) for d in depths],
    }
    with file_lock(out):  # two studies writing one file would lose one
        write_json(out, result)
    for n in names:
        c = result["caches"][n]
        cells = "  ".join(f"{k}: {v['answered']:g}/{v['needles']}" for k, v in c["by_depth"].items())
        print(
            f"{n:40s} {c['score']:.2f}   needles found by depth {cells}   missed {c['wrong']}, "
            f"{c['wrong_beginning_the_needle']} beginning the needle"
        )
    print(json.dumps({"splits": splits, "paired_against_window": result["paired_against_window"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
