"""Why SnapKV falls below a window on the multi-key needles with the question inside, on SmolLM2-135M.

Each sample is read once with its question inside (``bench kv``'s question protocol: the same task, length and seed,
so the same token ids), then answered from SnapKV's cache and a window of the same bytes. For each answer it says
what kind of wrong it is: the asked number cut short (a prefix of it), its first two digits followed by others,
another number that stands in the text (a look-alike key's), or something else, and what that is (no number, one
or two digits, a look-alike's number changed, the asked number's digits out of place, a number the text does not
hold); every wrong answer is kept. For each cache it says which of the asked number's tokens (SmolLM2 writes a
number one digit per token) each key/value head keeps, by the digit's place in the number.

    python bench/kv_snapkv_digits.py [--n 50] [--length 2048] [--fraction 0.5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tqdm import tqdm


KINDS = ("right", "cut short", "its first two digits, then others", "another number in the text", "other")
OTHER_KINDS = (
    "no number",
    "a number of one or two digits",
    "a number in the text, changed",
    "the asked number's digits, out of place",
    "a number not in the text",
)


def other_kind(first: str, want: str, others: set[str]) -> str:
    """What an answer of the kind "other" writes first (:data:`OTHER_KINDS`), ``first`` being its first number:
    none; one or two digits; a look-alike's number changed (its first three digits are those of a number in the
    text, ``others``); three of the asked number's digits in a row, not at its start; or a number the text does not
    hold in any of these ways."""
    if not first:
        return "no number"
    if len(first) < 3:
        return "a number of one or two digits"
    if any(o[:3] == first[:3] for o in others):
        return "a number in the text, changed"
    if any(want[i : i + 3] in first for i in range(len(want) - 2)):
        return "the asked number's digits, out of place"
    return "a number not in the text"


def _spans(lm, ids: list[int]) -> list[tuple[int, int]]:
    """Each token's character span in the text decoded token by token."""
    out, at = [], 0
    for t in ids:
        piece = lm.decode([t])
        out.append((at, at + len(piece)))
        at += len(piece)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv-snapkv-digits-smollm2.json"))
    args = ap.parse_args(argv)
    from multihead.bench.kv import check_study

    try:  # refused before any model is read, as bench kv refuses
        check_study(
            task="niah_multikey",
            length=args.length,
            n=args.n,
            fractions=[args.fraction],
            methods=["snapkv", "window"],
            protocol="question",
        )
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2

    from multihead._io import file_lock
    from multihead.bench.harness import machine_info, write_json
    from multihead.bench.kv import OursSide, smollm2_folder
    from multihead.data.ruler import samples_for, score
    from multihead.modules.kv import make_policy

    side = OursSide(smollm2_folder(), methods=["snapkv", "window"])
    lm = side.lm
    samples = samples_for(lm, "niah_multikey", length=args.length, count=args.n, seed=0)
    names = ("snapkv", "window")
    kinds = {n: dict.fromkeys(KINDS, 0) for n in names}
    other_kinds = {n: dict.fromkeys(OTHER_KINDS, 0) for n in names}
    scores: dict[str, list[float]] = {n: [] for n in names}
    digits_kept: dict[str, list[list[float]]] = {n: [] for n in names}
    wrong: dict[str, list[dict]] = {n: [] for n in names}
    for s in tqdm(samples, desc="SnapKV on look-alike keys"):
        q = s.questions[0]
        want = q.answers[0]
        ids = s.ids + q.ids[:-1]  # the question protocol: context and question read together
        text = "".join(lm.decode([t]) for t in ids)
        spans = _spans(lm, ids)
        start = text.find(want)  # the needle is in the context, before the question
        value = [i for i, (a, b) in enumerate(spans) if a < start + len(want) and b > start]
        others = set(re.findall(r"\d{5,}", text)) - {want}
        read = side.read(ids)
        budget = round(args.fraction * len(ids))
        for name in names:
            policy = make_policy(name, budget)
            probe = read["cache"].compress(policy, prompt_only=True)
            held = [set(pos[0].tolist()) for layer in probe.self_attn for pos in layer.positions()]
            digits_kept[name].append([sum(i in h for h in held) / len(held) for i in value])
            answer, *_ = side.answer({"read": read, "policy": policy, "first": probe}, q.ids[-1:], q.max_new_tokens)
            scores[name].append(score(answer, q.answers))
            got = re.findall(r"\d+", answer)
            first = got[0] if got else ""
            kind = (
                "right"
                if want in answer
                else "cut short"
                if first and want.startswith(first)
                else "its first two digits, then others"
                if first[:2] == want[:2]
                else "another number in the text"
                if first in others
                else "other"
            )
            kinds[name][kind] += 1
            if kind == "other":
                what = other_kind(first, want, others)
                other_kinds[name][what] += 1
                kind = f"other: {what}"
            if kind != "right":
                wrong[name].append({"answer": answer[:80], "expected": want, "kind": kind})

    def by_place(rows: list[list[float]]) -> list[float]:
        places = max(len(r) for r in rows)
        return [round(sum(r[i] for r in rows if i < len(r)) / sum(i < len(r) for r in rows), 3) for i in range(places)]

    result = {
        "study": "SnapKV on look-alike keys, question inside",
        "model": str(smollm2_folder()),
        "task": "niah_multikey",
        "protocol": "question",
        "length": args.length,
        "fraction": args.fraction,
        "n": args.n,
        "seed": 0,
        "machine": machine_info(None),
        "caches": {
            n: {
                "score": round(sum(scores[n]) / len(scores[n]), 4),
                "answers": kinds[n],
                "other_answers": other_kinds[n],
                "asked_value_tokens_kept_by_place": by_place(digits_kept[n]),
                "wrong_answers": wrong[n],
            }
            for n in names
        },
    }
    with file_lock(args.out):  # two studies writing one file would lose one
        write_json(args.out, result)
    print(json.dumps(result["caches"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
