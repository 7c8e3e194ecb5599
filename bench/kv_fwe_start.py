"""Why Knorm leads on the frequent-words task (fwe) and windowed caches fail it, on SmolLM2-135M.

Three explanations are put side by side, each with a cache that isolates it, on the same samples ``bench kv`` runs
(the same seed, so the same token ids), from one recorded read per sample:

- *the answer words are missing from the recent end*: counted directly (how often each expected word occurs in the
  last ``fraction`` of the text);
- *the cache loses the instruction*: a window that also keeps the whole instruction (``sinks`` = its tokens);
- *the model answers from the start of the text*: ``prefix``, the first ``budget - 1`` keys and the latest one.

Each cache is scored as ``bench kv`` scores it (the context protocol, greedy answers, RULER's share of expected
words), with the share of the instruction's keys it keeps and where its kept keys lie (by quarter of the context),
and compared question by question with the sign test. A baseline that reads no model: the first (last) three
distinct words of the text, scored as answers.

    python bench/kv_fwe_start.py [--n 50] [--length 2048] [--fractions 0.125,0.25] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

INSTRUCTION = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words.\n"
)


def _distinct(words: list[str], k: int) -> list[str]:
    out: list[str] = []
    for w in words:
        if w not in out:
            out.append(w)
        if len(out) == k:
            break
    return out


def _where(cache, length: int, header: int) -> tuple[float, list[float]]:
    """The share of the instruction's keys kept (over layers and key/value heads), and the share of kept keys in
    each quarter of the context."""
    kept = total = 0
    quarters = torch.zeros(4)
    for layer in cache.self_attn:
        for pos in layer.positions():  # (B, N): the positions one key/value head holds
            kept += int((pos[0] < header).sum())
            total += header
            quarters += torch.bincount((pos[0] * 4 // length).clamp(max=3), minlength=4).float()
    return kept / total, (quarters / quarters.sum()).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--fractions", default="0.125,0.25")
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv-fwe-start-smollm2.json"))
    args = ap.parse_args(argv)
    from multihead.bench.kv import check_study, numbers

    try:  # refused before any model is read, as bench kv refuses
        fractions = numbers(args.fractions, "--fractions")
        check_study(
            task="fwe",
            length=args.length,
            n=args.n,
            fractions=fractions,
            methods=["full", "window", "knorm", "head-aware"],
        )
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2

    from multihead._io import file_lock
    from multihead.bench.harness import machine_info, write_json
    from multihead.bench.kv import OursSide, sign_test, smollm2_folder
    from multihead.data.ruler import samples_for, score
    from multihead.modules.kv import make_policy

    side = OursSide(smollm2_folder(), methods=["full", "window", "knorm", "head-aware"])
    lm = side.lm
    samples = samples_for(lm, "fwe", length=args.length, count=args.n, seed=0)
    header = len(lm.encode("")[:1]) + len(lm.encode(INSTRUCTION, special=False))
    if samples[0].ids[:header] != lm.encode("")[:1] + lm.encode(INSTRUCTION, special=False):
        print("the fwe samples no longer start with the instruction this study names", file=sys.stderr)
        return 1

    rows: dict[str, dict] = {}
    baseline = {"first three distinct words": [], "last three distinct words": []}
    counts: dict[float, list[list[int]]] = {f: [] for f in fractions}

    def record(name: str, where, text: str, answers) -> None:
        row = rows.setdefault(name, {"scores": [], "instruction_kept": [], "quarters": []})
        row["scores"].append(score(text, answers))
        if where is not None:
            row["instruction_kept"].append(where[0])
            row["quarters"].append(where[1])

    for s in tqdm(samples, desc="fwe: what the caches keep"):
        q, length = s.questions[0], len(s.ids)
        words = lm.decode(s.ids[header:]).split()
        baseline["first three distinct words"].append(score(" ".join(_distinct(words, 3)), q.answers))
        baseline["last three distinct words"].append(score(" ".join(_distinct(words[::-1], 3)), q.answers))
        read = side.read(s.ids)
        full = make_policy("full")
        text, *_ = side.answer({"read": read, "policy": full}, q.ids, q.max_new_tokens)
        record("full", None, text, q.answers)
        for f in fractions:
            b = round(f * length)
            tail = lm.decode(s.ids[length - b :]).split()
            counts[f].append([tail.count(a) for a in q.answers])
            for name, policy in (
                ("window", make_policy("window", b)),
                ("window + instruction", make_policy("window", b, sinks=header)),
                ("prefix", make_policy("window", b, sinks=b - 1)),
                ("knorm", make_policy("knorm", b)),
                ("head-aware", side.policy("head-aware", f, length)),
            ):
                probe = read["cache"].compress(policy, prompt_only=True)
                where = _where(probe, length, header)  # before the answer's keys join the cache
                text, *_ = side.answer({"read": read, "policy": policy, "first": probe}, q.ids, q.max_new_tokens)
                record(f"{name} @ {f:g}", where, text, q.answers)

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    result = {
        "study": "fwe: where the answer comes from",
        "model": str(smollm2_folder()),
        "length": args.length,
        "n": args.n,
        "seed": 0,
        "instruction_tokens": header,
        "machine": machine_info(None),
        "baseline_without_model": {k: mean(v) for k, v in baseline.items()},
        "answer_words_in_recent_end": {
            f"{f:g}": {
                "least per rank": [min(c[i] for c in counts[f]) for i in range(3)],
                "mean per rank": [round(mean([c[i] for c in counts[f]]), 1) for i in range(3)],
            }
            for f in fractions
        },
        "caches": {
            name: {
                "score": round(mean(r["scores"]), 4),
                "instruction_kept": None if not r["instruction_kept"] else round(mean(r["instruction_kept"]), 3),
                "kept_by_quarter": None
                if not r["quarters"]
                else [round(mean([qq[i] for qq in r["quarters"]]), 3) for i in range(4)],
                "scores": r["scores"],
            }
            for name, r in rows.items()
        },
        "paired": {
            f"{a} vs {b} @ {f:g}": sign_test(rows[f"{a} @ {f:g}"]["scores"], rows[f"{b} @ {f:g}"]["scores"])
            for f in fractions
            for a, b in (("prefix", "window"), ("window + instruction", "window"), ("prefix", "knorm"))
        },
    }
    with file_lock(args.out):  # two studies writing one file would lose one
        write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "caches"}, indent=1))
    for name, c in result["caches"].items():
        print(
            f"{name:28s} score {c['score']:.3f}  instruction kept {c['instruction_kept']}  by quarter {c['kept_by_quarter']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
