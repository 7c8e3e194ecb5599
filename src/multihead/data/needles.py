"""Needle-in-a-haystack prompts from built-in text, seeded: a long stretch of held-out IMDB reviews with one
sentence that states a 7-digit number for a city (the *needle*) placed at a chosen depth, then a question whose
answer is that number (Kamradt's test as Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality", use it to find retrieval heads).

The prompt is built from token ids, not text, so that its length is exact and the answer's tokens appear verbatim
inside the needle: ``... The special magic number for Lisbon is`` + ``answer`` + ``. ...`` in the haystack, and
``What is the special magic number for Lisbon? The special magic number for Lisbon is`` at the end, which the
answer continues.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._config import MAX_NEEDLES  # one bound for the command's flags and the library

CITIES = (
    "Lisbon",
    "Nairobi",
    "Osaka",
    "Quito",
    "Tbilisi",
    "Hobart",
    "Dakar",
    "Tallinn",
    "Cusco",
    "Bergen",
    "Hanoi",
    "Windhoek",
)


@dataclass(frozen=True)
class Needle:
    """One prompt: ``ids`` (the whole prompt, question included), ``answer`` (the tokens that continue it), where
    the needle sits (``needle_start``, ``needle_end``: token positions in ``ids``), the answer's first position
    inside the needle (``answer_at``) and the depth asked for (0 = start of the haystack, 1 = its end)."""

    ids: list[int]
    answer: list[int]
    needle_start: int
    needle_end: int
    answer_at: int
    depth: float
    city: str
    number: str


def haystack_ids(encode: Callable[[str], list[int]], texts: Sequence[str], need: int) -> list[int]:
    """At least ``need`` token ids of ``texts`` joined by blank lines (IMDB's ``<br />`` read as line breaks)."""
    ids: list[int] = []
    for text in texts:
        ids += encode(text.replace("<br />", "\n") + "\n\n")
        if len(ids) >= need:
            return ids
    raise ValueError(
        f"the haystack text holds {len(ids):,} tokens, fewer than the {need:,} asked for: ask for shorter prompts"
    )


def make_needles(
    encode: Callable[[str], list[int]],
    texts: Sequence[str],
    *,
    length: int,
    count: int,
    seed: int = 0,
    start: Sequence[int] = (),
    depths: Sequence[float] | None = None,
    keys: int = 1,
) -> list[Needle]:
    """``count`` prompts of exactly ``length`` tokens (``start``: the model's start token(s), first in each).
    ``encode(text)`` gives token ids without special tokens. The needles sit at ``depths`` (default: spread evenly
    from 0.1 to 0.9); each prompt draws its own stretch of haystack, city and number from ``seed``.

    ``keys`` > 1: each prompt holds that many needles, each with its own city and number (multi-key retrieval, the
    harder case: a cache must keep the one asked for among look-alikes); the one asked for sits at the prompt's
    depth, the others spread evenly through the rest of the haystack."""
    if isinstance(keys, bool) or not isinstance(keys, int) or not 1 <= keys <= len(CITIES):
        raise ValueError(f"keys is the number of needles in one prompt, in [1, {len(CITIES)}], got {keys!r}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_NEEDLES:
        raise ValueError(
            f"count is a number of needle prompts in [1, {MAX_NEEDLES}], got {count!r} (each prompt is read whole: "
            "more is hours of work)"
        )
    rng = random.Random(seed)
    depths = list(depths) if depths is not None else [0.1 + 0.8 * i / max(count - 1, 1) for i in range(count)]
    if len(depths) != count or not all(0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"give one depth in [0, 1] per needle ({count}), got {depths}")
    order = list(range(len(texts)))
    rng.shuffle(order)
    out = []
    for i, depth in enumerate(depths):
        city = CITIES[rng.randrange(len(CITIES))]
        number = str(rng.randrange(1_000_000, 10_000_000))
        answer = encode(f" {number}")
        needle = encode(f" The special magic number for {city} is") + answer + encode(". ")
        question = encode(f"\n\nWhat is the special magic number for {city}? The special magic number for {city} is")
        others = [  # look-alike needles: other cities, other numbers
            encode(f" The special magic number for {c} is {rng.randrange(1_000_000, 10_000_000)}. ")
            for c in rng.sample([c for c in CITIES if c != city], keys - 1)
        ]
        room = length - len(start) - len(needle) - len(question) - sum(len(o) for o in others)
        if room < 16:
            raise ValueError(
                f"a prompt of {length} tokens leaves no room for a haystack around the needle and the question "
                f"({length - room} tokens): ask for at least {length - room + 16}"
            )
        shift = (i * len(order)) // count  # each prompt reads its own stretch of reviews
        hay = haystack_ids(encode, [texts[j] for j in order[shift:] + order[:shift]], room)[:room]
        at = int(round(depth * room))
        spread = [(int(room * (j + 0.5) / len(others)), 1, o) for j, o in enumerate(others)]
        ids, cut, needle_start = list(start), 0, 0
        for where, other, text in sorted([(at, 0, needle), *spread]):
            ids += hay[cut:where]
            cut = where
            if not other:  # the needle asked for
                needle_start = len(ids)
            ids += text
        ids += hay[cut:] + question
        out.append(
            Needle(
                ids=ids,
                answer=answer,
                needle_start=needle_start,
                needle_end=needle_start + len(needle),
                answer_at=needle_start + len(needle) - len(answer) - len(encode(". ")),
                depth=depth,
                city=city,
                number=number,
            )
        )
    return out


__all__ = ["CITIES", "Needle", "haystack_ids", "make_needles"]
