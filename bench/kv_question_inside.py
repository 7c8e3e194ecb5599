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

Then where the rest comes from. The question's tokens reach the answer only through their keys and values: read with
the context, those were computed over the whole text; fed after the compressed context, over what the cache kept.
So the context protocol is run again with the question's keys and values, once fed, replaced by the whole-text
read's, in every key/value head, in the heads the head-aware cache keeps whole only, or in its windowed heads only
(and, as a control, in none: the context protocol with the question fed in two parts, which must answer as it does).
If the replaced keys and values give the question protocol's score, they carry the gain; the heads where they do
tell which heads read it.

Then what in the windowed heads, and where: the keys alone and the values alone (is it where the answer's tokens
look among the question's, or what they read there?), and each third of the layers alone and every layer but each
third (which layers suffice, and which are needed).

    python bench/kv_question_inside.py [--n 50] [--length 4096] [--fraction 0.125] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

CACHES = ("full", "window", "head-aware")
WAYS = ("context", "context, first digit given", "question inside", "question inside, first digit given")
# what a swap replaces, both or one of the two: the cache's tensors, and how the way's name says it
PARTS = {"": (("k", "v"), "keys"), "keys": (("k",), "keys, not values,"), "values": (("v",), "values, not keys,")}


@dataclass(frozen=True)
class Swap:
    """One way of running the context protocol with the question's keys and values taken from the whole-text read:
    in which key/value heads (``where``: every head, the head-aware cache's whole heads, its windowed heads, or none,
    the control), in which layers (``layers``: only those, or with ``but``, every layer but those; ``None``: every
    layer), which of the two (``part``: a key of :data:`PARTS`), and for which caches."""

    where: str
    caches: tuple[str, ...] = ("head-aware",)
    layers: range | None = None
    but: bool = False
    part: str = ""

    @property
    def name(self) -> str:
        _, what = PARTS[self.part]
        where = self.where
        if self.layers is not None:
            span = f"{self.layers.start} to {self.layers.stop - 1}"
            where += f" of every layer but {span}" if self.but else f" of layers {span}"
        return f"the question's {what} from the whole text in {where}"

    def heads(self, policy, kv_heads: list[int]) -> list[list[int]]:
        """Per layer, the key/value heads this swap replaces under ``policy``."""
        heads = heads_of(policy, self.where, kv_heads)
        if self.layers is None:
            return heads
        return [h if (layer in self.layers) != self.but else [] for layer, h in enumerate(heads)]


def swaps(layers: int, bands: int = 3) -> tuple[Swap, ...]:
    """The swaps the study runs on a model of ``layers`` layers: every head, the whole heads, the windowed heads (both
    keys and values, keys only, values only), the windowed heads of each of ``bands`` bands of layers alone and of
    every layer but each band, and none (the control)."""
    cut = [round(layers * b / bands) for b in range(bands + 1)]
    spans = [range(a, b) for a, b in zip(cut, cut[1:])]
    return (
        Swap("every head", ("head-aware", "window")),
        Swap("the whole heads"),
        Swap("the windowed heads"),
        Swap("the windowed heads", part="keys"),
        Swap("the windowed heads", part="values"),
        *(Swap("the windowed heads", layers=span) for span in spans),
        *(Swap("the windowed heads", layers=span, but=True) for span in spans),
        Swap("no head", ("head-aware", "window")),
    )


def replaced(swap: Swap | str, digit: str = "") -> str:
    """The name of the way that answers with the question's keys and values from the whole text as ``swap`` says (a
    :class:`Swap`, or a ``where`` for every layer, keys and values both)."""
    swap = swap if isinstance(swap, Swap) else Swap(swap)
    return f"context, {swap.name}{digit}"


def heads_of(policy, where: str, kv_heads: list[int]) -> list[list[int]]:
    """Per layer, the key/value heads ``where`` names under ``policy``: the head-aware cache's whole heads are its
    ``keep_all``; any other cache has none."""
    whole = [list(h) for h in getattr(policy, "keep_all", ())] or [[] for _ in kv_heads]
    every = [list(range(g)) for g in kv_heads]
    return {
        "every head": every,
        "the whole heads": whole,
        "the windowed heads": [[h for h in e if h not in w] for e, w in zip(every, whole)],
        "no head": [[] for _ in kv_heads],
    }[where]


def replace_keys(cache, read, start: int, count: int, heads: list[list[int]], part: str = "") -> int:
    """In ``cache`` (a compressed cache, the question then fed over it), the keys and values (``part``: a key of
    :data:`PARTS`, both or one) of positions ``start`` to ``start + count - 1`` in the key/value heads
    ``heads[layer]`` replaced in place by those the recorded ``read`` (every key kept) holds there. Both hold keys
    as the model stores them (rotated at the same positions), so a replaced key is the key the whole-text read
    computed. Returns the number of (layer, head) replaced; ValueError where either cache does not hold those
    positions in that order."""
    done, want = 0, torch.arange(start, start + count)
    for layer, (mine, rec) in enumerate(zip(cache.self_attn, read.self_attn, strict=True)):
        [whole] = rec.groups
        for grp in mine.groups:
            for local, h in enumerate(grp.kv_heads):
                if h not in heads[layer]:
                    continue
                n = grp.length
                if not torch.equal(grp.pos[0, local, n - count :].cpu(), want) or not torch.equal(
                    whole.pos[0, h, start : start + count].cpu(), want
                ):
                    raise ValueError(f"layer {layer}, key/value head {h}: positions {start}.. are not where expected")
                if grp.buffers.k.data_ptr() == whole.buffers.k.data_ptr():
                    raise ValueError("the compressed cache shares the read's tensors; feed the question first")
                for kv in PARTS[part][0]:
                    getattr(grp.buffers, kv)[0, local, n - count :] = getattr(whole.buffers, kv)[
                        0, h, start : start + count
                    ]
                done += 1
    return done


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
    table = swaps(len(side.kv_heads))
    [control] = [swap for swap in table if swap.where == "no head"]
    samples = samples_for(side.lm, "niah_single_number", length=args.length, count=args.n, seed=0)
    protocols = {"context": "context", "question": "question inside"}  # bench kv's name: this study's
    keys = {w: [] for w in protocols.values()}
    ways = [(c, w) for c in CACHES for w in WAYS] + [
        (c, replaced(swap, digit)) for swap in table for c in swap.caches for digit in ("", ", first digit given")
    ]
    scores = {cw: [] for cw in ways}
    right_first = {cw: [] for cw in ways}

    def scored(cache: str, named: str, shown: list[int], text: str, q) -> None:
        """One answer (``shown``: the tokens given before what was generated) scored as bench kv scores it."""
        text = side.lm.decode(shown) + text
        scores[(cache, named)].append(score(text, q.answers))
        right_first[(cache, named)].append(float(first_digit(text) == q.answers[0][0]))

    for s in tqdm(samples, desc="the question inside or after"):
        reads = {}
        for protocol, way in protocols.items():
            [(ids, [(then, q)])] = reads_of(s, protocol)  # what bench kv reads once, and what each answer starts from
            start = given(side.lm, q.answers[0])
            read = reads[way] = side.read(ids)
            keys[way].append(kept_keys(args.fraction, len(ids), "kvpress"))
            for cache in CACHES:
                state = side.compressed(read, cache, args.fraction)  # the full cache keeps every key at any fraction
                for named, shown in ((way, []), (f"{way}, first digit given", start)):
                    text, *_ = side.answer(state, then + shown, q.max_new_tokens)  # a second answer compresses anew
                    scored(cache, named, shown, text, q)
        # the context protocol again, the question fed over the compressed context, then its keys and values (all
        # but the last token's, which the question protocol did not read with the context either) replaced
        context, whole = reads["context"], reads["question inside"]
        asked = q.ids[:-1]
        for swap in table:
            for cache in swap.caches:
                for digit, shown in (("", []), (", first digit given", start)):
                    state = side.compressed(context, cache, args.fraction)
                    with torch.no_grad():
                        side.model(torch.tensor([asked]), cache=state["first"])
                    heads = swap.heads(state["policy"], side.kv_heads)
                    replace_keys(state["first"], whole["cache"], context["length"], len(asked), heads, swap.part)
                    text, *_ = side.answer(state, q.ids[-1:] + shown, q.max_new_tokens)
                    scored(cache, replaced(swap, digit), shown, text, q)

    def name(c: str, w: str) -> str:
        return f"{c}, {w}"

    result = {
        "study": "the question inside or after: the first digit, and the question's keys and values",
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
                **{  # each replacement against both protocols, the first digit given or not alike
                    f"{replaced(swap, digit)}, against {base}{digit}": sign_test(
                        scores[(c, replaced(swap, digit))], scores[(c, base + digit)]
                    )
                    for swap in table
                    if c in swap.caches
                    for digit in ("", ", first digit given")
                    for base in ("context", "question inside")
                },
            }
            for c in CACHES
        },
        "control": {  # the question fed in two parts, nothing replaced: the context protocol's answers, one by one
            c: sum(a == b for a, b in zip(scores[(c, replaced(control))], scores[(c, "context")]))
            for c in control.caches
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
