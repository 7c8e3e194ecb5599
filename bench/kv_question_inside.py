"""Why the head-aware cache answers more single needles with the question inside than after it, on SmolLM2-135M.

At 4k and 1/8 of the keys, ``bench kv``'s head-aware cache answers 0.62 of the single needles when the question is
read with the context (the question protocol) and 0.32 when the context is compressed first and the question follows
(the context protocol); a window of the same bytes answers 0.16 and 0.18. Both protocols keep the same share of the
context's keys. What differs is what the question's own keys and values saw: read with the context, the question
attended to the whole text before anything was dropped.

Two explanations are put side by side:

- *the question inside gives the first digit*: read with the whole text, the question already holds the needle's
  first digit; the heads the head-aware cache keeps whole (induction heads, by the data-free split) hold the needle
  and copy the rest of it once it has begun. Then the context protocol with the first digit given scores as the
  question protocol does for the head-aware cache, and the window, which holds no needle to copy from, gains little
  from either;
- *the question inside helps every cache alike*: then the window gains as much as the head-aware cache.

Each sample (the same samples as ``bench kv``: same task, length and seed, so the same token ids) is read once per
protocol and answered by the head-aware cache, a window of the same bytes and the full cache, four ways: each
protocol as ``bench kv`` runs it, and each with the needle's first digit given (its tokens fed after the question,
the rest generated from there). Each answer is scored as ``bench kv`` scores it, its first digit is checked against
the needle's, and the ways are compared question by question (sign test). Both protocols keep kvpress's count of keys
of what was read (as the 4k grid with the question inside does), so the two protocols' caches differ by the
question's tokens only.

    python bench/kv_question_inside.py [--n 50] [--length 4096] [--fraction 0.125] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tqdm import tqdm

CACHES = ("full", "window", "head-aware")
WAYS = ("context", "context, first digit given", "question inside", "question inside, first digit given")


def first_digit(answer: str) -> str:
    """The first digit the answer writes ('' if none)."""
    got = re.search(r"\d", answer)
    return got.group(0) if got else ""


def given(lm, needle: str) -> list[int]:
    """The tokens of the answer's start up to and including the needle's first digit (SmolLM2 writes a space, then
    one token per digit); ``lm``: the model's ``encode`` (``special=False``, as the tasks encode) and ``decode``."""
    ids = lm.encode(" " + needle, special=False)
    for k in range(1, len(ids) + 1):
        if any(c.isdigit() for c in lm.decode(ids[:k])):
            return ids[:k]
    raise ValueError(f"the needle {needle!r} holds no digit; the study asks for a number task")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--fraction", type=float, default=0.125)
    ap.add_argument("--out", type=Path, help="default: bench/results/kv-question-inside-smollm2-LENGTH[-fF].json")
    args = ap.parse_args(argv)
    out = args.out or Path(
        f"bench/results/kv-question-inside-smollm2-{args.length}"
        + ("" if args.fraction == 0.125 else f"-f{args.fraction:g}")
        + ".json"
    )
    from multihead.bench.kv import check_study

    try:  # refused before any model is read, as bench kv refuses
        for protocol in ("context", "question"):
            check_study(
                task="niah_single_number",
                length=args.length,
                n=args.n,
                fractions=[args.fraction],
                methods=list(CACHES),
                protocol=protocol,
            )
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2

    from multihead._io import file_lock
    from multihead.bench.harness import machine_info, write_json
    from multihead.bench.kv import OursSide, kept_keys, reads_of, sign_test, smollm2_folder
    from multihead.data.ruler import samples_for, score

    side = OursSide(smollm2_folder(), methods=list(CACHES), budget="kvpress")
    samples = samples_for(side.lm, "niah_single_number", length=args.length, count=args.n, seed=0)
    protocols = {"context": "context", "question": "question inside"}  # bench kv's name: this study's
    keys = {w: [] for w in protocols.values()}
    scores = {(c, w): [] for c in CACHES for w in WAYS}
    right_first = {(c, w): [] for c in CACHES for w in WAYS}
    for s in tqdm(samples, desc="the question inside or after"):
        for protocol, way in protocols.items():
            [(ids, [(then, q)])] = reads_of(s, protocol)  # what bench kv reads once, and what each answer starts from
            start = given(side.lm, q.answers[0])
            read = side.read(ids)
            keys[way].append(kept_keys(args.fraction, len(ids), "kvpress"))
            for cache in CACHES:
                state = side.compressed(read, cache, args.fraction)  # the full cache keeps every key at any fraction
                for named, shown in ((way, []), (f"{way}, first digit given", start)):
                    text, *_ = side.answer(state, then + shown, q.max_new_tokens)  # a second answer compresses anew
                    text = side.lm.decode(shown) + text
                    scores[(cache, named)].append(score(text, q.answers))
                    right_first[(cache, named)].append(float(first_digit(text) == q.answers[0][0]))

    def name(c: str, w: str) -> str:
        return f"{c}, {w}"

    result = {
        "study": "the question inside or after: the first digit",
        "model": str(smollm2_folder()),
        "task": "niah_single_number",
        "length": args.length,
        "fraction": args.fraction,
        "n": args.n,
        "seed": 0,
        "budget": "kvpress",
        "keys_kept_per_head_mean": {w: round(sum(v) / len(v), 1) for w, v in keys.items()},
        "machine": machine_info(None),
        "answers": {
            name(c, w): {
                "score": round(sum(v) / len(v), 4),
                "first_digit_right": round(sum(right_first[(c, w)]) / len(v), 4),
                "scores": v,
            }
            for (c, w), v in scores.items()
        },
        "paired": {
            c: {
                "question inside against context": sign_test(scores[(c, "question inside")], scores[(c, "context")]),
                "context, first digit given, against context": sign_test(
                    scores[(c, "context, first digit given")], scores[(c, "context")]
                ),
                "context, first digit given, against question inside": sign_test(
                    scores[(c, "context, first digit given")], scores[(c, "question inside")]
                ),
                "question inside, first digit given, against question inside": sign_test(
                    scores[(c, "question inside, first digit given")], scores[(c, "question inside")]
                ),
            }
            for c in CACHES
        },
    }
    with file_lock(out):  # two studies writing one file would lose one
        write_json(out, result)
    for c, w in scores:
        a = result["answers"][name(c, w)]
        print(f"{name(c, w):50s} {a['score']:.2f}   first digit right {a['first_digit_right']:.2f}")
    print(json.dumps(result["paired"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
