"""RULER-style long-context tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"), generated offline from text the project ships, seeded and token-exact.

Each task is one class registered in :data:`TASKS` (``@task``); :meth:`RulerTask.make` builds ``count`` samples of
``length`` tokens for a tokenizer. A sample is a *context* and one or more *questions* about it, kept apart so that
a benchmark can read the context alone, compress its cache once and then ask each question (kvpress's pipeline), or
read context and question together. Every expected answer appears verbatim in the context.

The tasks, as RULER defines them (QA is left out: its documents are not shipped here):

* ``niah_single_number`` / ``niah_single_word`` / ``niah_single_uuid``: one needle ("One of the special magic
  numbers for KEY is: VALUE.") hidden in held-out IMDB reviews, its value asked for;
* ``niah_multikey``: four needles with look-alike keys, one asked for;
* ``niah_multivalue``: one key with four values, all asked for;
* ``niah_multiquery``: four keys, all asked for at once;
* ``vt`` (variable tracking): a chain of five assignments (``VAR ABCDE = 12345``, ``VAR FGHIJ = VAR ABCDE``, ...)
  hidden in RULER's repeated filler sentences; every variable holding the value is asked for;
* ``cwe`` (common words extraction): a numbered list of words in which ten appear often, the others three times;
  the ten are asked for;
* ``fwe`` (frequent words extraction): coded words drawn from a Zipf distribution; the three most frequent asked for.

The haystack tasks are exactly ``length`` tokens (context + the longest question); the word lists fill up to
``length`` with whole entries (within one entry of it). Scored as RULER scores them (:func:`score`): the share of
expected strings found in the answer, case-insensitive.
"""

from __future__ import annotations

import random
import string
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

Encode = Callable[[str], list[int]]

# RULER's filler for variable tracking ("noise" haystack)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
MAX_SAMPLES = 1000  # samples of one task and length: each is read whole, thousands of tokens


@dataclass(frozen=True)
class Question:
    """One question: its token ids (question and the answer's prefix, which the answer continues), the strings the
    answer must contain, and the most tokens an answer may take."""

    ids: list[int]
    answers: tuple[str, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class Sample:
    """One context (``ids``, the start token first where the tokenizer has one) and its questions."""

    task: str
    ids: list[int]
    questions: tuple[Question, ...]

    def prompt(self, i: int = 0) -> list[int]:
        """Context and question ``i`` together (the question-inside protocol)."""
        return self.ids + self.questions[i].ids


def score(answer: str, expected: Sequence[str]) -> float:
    """RULER's ``string_match_all``: the share of ``expected`` strings found in ``answer`` (case-insensitive)."""
    text = answer.lower()
    return sum(e.lower() in text for e in expected) / len(expected)


TASKS: dict[str, type[RulerTask]] = {}


def task(cls: type[RulerTask]) -> type[RulerTask]:
    """Register a task class under its ``name``."""
    TASKS[cls.name] = cls
    return cls


class Source:
    """What a task draws from: the tokenizer (``encode`` without special tokens, ``start`` ids), the held-out texts
    for haystacks and a word list taken from them, and the sample's random generator."""

    def __init__(self, encode: Encode, texts: Sequence[str], start: Sequence[int], rng: random.Random):
        self.encode, self.texts, self.start, self.rng = encode, texts, list(start), rng
        self._words: list[str] | None = None

    @property
    def words(self) -> list[str]:
        """Lower-case words of 5-9 letters from the texts, in order of first use (deterministic)."""
        if self._words is None:
            seen: dict[str, None] = {}
            for t in self.texts[:2000]:
                for w in t.replace("<br />", " ").split():
                    if w.isalpha() and w.islower() and 5 <= len(w) <= 9:
                        seen.setdefault(w)
            self._words = list(seen)
            if len(self._words) < 200:
                raise ValueError("the haystack texts hold too few distinct words for the word tasks")
        return self._words

    def haystack(self, need: int, shift: int) -> list[int]:
        """``need`` token ids of reviews (joined by blank lines), starting ``shift`` texts in."""
        from .needles import haystack_ids

        n = len(self.texts)
        order = [(shift + i) % n for i in range(n)]
        return haystack_ids(self.encode, [self.texts[j] for j in order], need)[:need]

    def boundaries(self, hay: list[int]) -> list[int]:
        """The positions in ``hay`` just after a sentence or a line ends (where RULER puts its needles)."""
        if not hasattr(self, "_ends"):
            self._ends = {t[-1] for t in (self.encode(x) for x in (".", ". ", "\n", ".\n", "!", "?")) if t}
        out = [0] + [i for i in range(1, len(hay) + 1) if hay[i - 1] in self._ends]
        return out

    def key(self) -> str:
        a, b = self.rng.sample(self.words, 2)
        return f"{a}-{b}"

    def number(self) -> str:
        return str(self.rng.randrange(1_000_000, 10_000_000))

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))


class RulerTask:
    """One RULER task: :meth:`sample` builds one sample of ``length`` tokens from a :class:`Source`."""

    name: ClassVar[str] = ""
    max_new_tokens: ClassVar[int] = 128  # RULER's generation budget for the task; capped per question below

    def sample(self, src: Source, length: int, index: int) -> Sample:
        raise NotImplementedError

    def make(
        self, encode: Encode, texts: Sequence[str], *, length: int, count: int, seed: int = 0, start: Sequence[int] = ()
    ) -> list[Sample]:
        """``count`` samples of ``length`` tokens (``start``: the model's start token(s), first in each)."""
        check_count(count)
        out = []
        for i in range(count):
            rng = random.Random(f"{self.name}:{seed}:{length}:{i}")
            out.append(self.sample(Source(encode, texts, start, rng), length, i))
        return out

    def question(self, src: Source, text: str, answers: Sequence[str]) -> Question:
        longest = len(src.encode(" " + ", ".join(answers)))
        return Question(src.encode(text), tuple(answers), min(self.max_new_tokens, longest + 8))


def check_count(count) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SAMPLES:
        raise ValueError(f"n is a number of samples per task and length in [1, {MAX_SAMPLES}], got {count!r}")


def make_task(name: str) -> RulerTask:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]()


def _hide(src: Source, head: list[int], hay: list[int], parts: list[list[int]]) -> list[int]:
    """``head``, then ``hay`` with ``parts`` put in it, in order, at sentence boundaries drawn at random."""
    cuts = sorted(src.rng.choice(src.boundaries(hay)) for _ in parts)
    ids, cut = list(head), 0
    for at, part in zip(cuts, parts):
        ids += hay[cut:at] + part
        cut = at
    return ids + hay[cut:]


# ------------------------------------------------------------------------------------------------ needle tasks
class _Needles(RulerTask):
    """Needles in held-out reviews: ``keys`` keys with ``values`` values each, ``asked`` keys asked about."""

    kind: ClassVar[str] = "number"  # number | word | uuid
    keys: ClassVar[int] = 1
    values: ClassVar[int] = 1
    asked: ClassVar[int] = 1

    def value(self, src: Source) -> str:
        return {"number": src.number, "word": lambda: src.rng.choice(src.words), "uuid": src.uuid}[self.kind]()

    def sample(self, src: Source, length: int, index: int) -> Sample:
        kind = self.kind
        keys = [src.key() for _ in range(self.keys)]
        while len(set(keys)) < len(keys):
            keys = [src.key() for _ in range(self.keys)]
        values = {k: [self.value(src) for _ in range(self.values)] for k in keys}
        asked = keys[: self.asked]
        intro = src.encode(
            f"Some special magic {kind}s are hidden within the following text. Make sure to memorize it. I will "
            f"quiz you about the {kind}s afterwards.\n"
        )
        needles = [src.encode(f" One of the special magic {kind}s for {k} is: {v}. ") for k in keys for v in values[k]]
        src.rng.shuffle(needles)
        if len(asked) == 1 and self.values == 1:
            q = (
                f"\nWhat is the special magic {kind} for {asked[0]} mentioned in the provided text? The special "
                f"magic {kind} for {asked[0]} mentioned in the provided text is"
            )
        else:
            who = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + f", and {asked[-1]}"
            q = (
                f"\nWhat are all the special magic {kind}s for {who} mentioned in the provided text? The special "
                f"magic {kind}s for {who} mentioned in the provided text are"
            )
        question = self.question(src, q, [v for k in asked for v in values[k]])
        room = length - len(src.start) - len(intro) - sum(map(len, needles)) - len(question.ids)
        if room < 16:
            raise ValueError(
                f"a {self.name} sample of {length} tokens leaves no room for a haystack: ask for at least "
                f"{length - room + 16} tokens"
            )
        ids = _hide(src, src.start + intro, src.haystack(room, shift=index * 7), needles)
        return Sample(self.name, ids, (question,))


@task
class NeedleNumber(_Needles):
    name = "niah_single_number"


@task
class NeedleWord(_Needles):
    name = "niah_single_word"
    kind = "word"


@task
class NeedleUUID(_Needles):
    name = "niah_single_uuid"
    kind = "uuid"


@task
class MultiKey(_Needles):
    name = "niah_multikey"
    keys = 4


@task
class MultiValue(_Needles):
    name = "niah_multivalue"
    values = 4


@task
class MultiQuery(_Needles):
    name = "niah_multiquery"
    keys = 4
    asked = 4


# ------------------------------------------------------------------------------------------------ the others
@task
class VariableTracking(RulerTask):
    """One chain of ``hops`` + 1 variables holding the same value, in RULER's filler."""

    name = "vt"
    max_new_tokens = 30
    hops: ClassVar[int] = 4

    def sample(self, src: Source, length: int, index: int) -> Sample:
        names: list[str] = []
        while len(names) < self.hops + 1:
            n = "".join(src.rng.choice(string.ascii_uppercase) for _ in range(5))
            if n not in names:
                names.append(n)
        value = str(src.rng.randrange(10_000, 100_000))
        chain = [f"VAR {names[0]} = {value}. "] + [f"VAR {b} = VAR {a}. " for a, b in zip(names, names[1:])]
        intro = src.encode("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n")
        parts = [src.encode(c) for c in chain]
        q = (
            f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
            f"According to the chain(s) of variable assignment in the text above, {len(names)} variables are "
            "assigned the value " + value + ", they are:"
        )
        question = self.question(src, q, names)
        room = length - len(src.start) - len(intro) - sum(map(len, parts)) - len(question.ids)
        if room < 16:
            raise ValueError(f"a vt sample of {length} tokens leaves no room: ask for at least {length - room + 16}")
        noise = src.encode(NOISE)
        hay = (noise * (room // len(noise) + 1))[:room]
        ids = _hide(src, src.start + intro, hay, parts)  # in chain order, at rising depths
        return Sample(self.name, ids, (question,))


def _fill(src: Source, head: list[int], tail: int, entries: list[str], length: int) -> tuple[list[int], int]:
    """``head`` then as many ``entries`` (numbered ``1. word``) as fit before ``tail`` tokens more reach ``length``;
    the ids and the number of entries written."""
    ids = list(head)
    for i, w in enumerate(entries):
        e = src.encode(f"{i + 1}. {w}\n")
        if len(ids) + len(e) + tail > length:
            return ids, i
        ids += e
    return ids, len(entries)


@task
class CommonWords(RulerTask):
    """A numbered list: ``common`` words ``often`` times each, other words 3 times each, shuffled."""

    name = "cwe"
    max_new_tokens = 120
    common: ClassVar[int] = 10

    def sample(self, src: Source, length: int, index: int) -> Sample:
        words = src.rng.sample(src.words, 400)
        common, rare = words[: self.common], words[self.common :]
        head = src.start + src.encode(
            "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n"
        )
        q = (
            f"\nQuestion: What are the {self.common} most common words in the above list? Answer: The top "
            f"{self.common} words that appear most often in the list are:"
        )
        question = self.question(src, q, common)
        budget = length - len(head) - len(question.ids)
        cost = {w: len(src.encode(f"{len(words)}. {w}\n")) for w in words}  # an entry's tokens (a 3-digit number)
        often = max(4, min(30, budget // 2 // sum(cost[w] for w in common)))  # RULER's 30 where the list is long
        pool = [w for w in common for _ in range(often)]
        used = often * sum(cost[w] for w in common)
        for w in rare:  # 3 each while they fit
            if used + 3 * cost[w] > budget:
                break
            pool += [w] * 3
            used += 3 * cost[w]
        src.rng.shuffle(pool)
        ids, written = _fill(src, head, len(question.ids), pool, length)
        shown = Counter(pool[:written])
        top = [w for w, _ in shown.most_common(self.common)]
        if set(top) != set(common) or shown[common[-1]] <= 3:
            raise ValueError(f"a cwe sample of {length} tokens is too short to repeat its common words: ask for more")
        return Sample(self.name, ids, (question,))


@task
class FrequentWords(RulerTask):
    """Coded words (random letters) drawn from a Zipf distribution (alpha 2); the three most frequent asked for."""

    name = "fwe"
    max_new_tokens = 50
    vocab: ClassVar[int] = 600

    def sample(self, src: Source, length: int, index: int) -> Sample:
        coded: list[str] = []
        while len(coded) < self.vocab:
            w = "".join(src.rng.choice(string.ascii_lowercase) for _ in range(src.rng.randrange(3, 6)))
            if w not in coded:
                coded.append(w)
        head = src.start + src.encode(
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words.\n"
        )
        weights = [1 / (r + 1) ** 2 for r in range(self.vocab)]
        q_text = (
            "\nQuestion: Do not provide any explanation. What are the three most frequently appeared words in the "
            "above coded text? Answer: According to the coded text above, the three most frequently appeared words "
            "are:"
        )
        room = length - len(head) - len(src.encode(q_text))
        size = {w: len(src.encode(f" {w}")) for w in coded}
        drawn: list[str] = []
        used = 0
        while True:
            w = src.rng.choices(coded, weights)[0]
            if used + size[w] > room:
                break
            drawn.append(w)
            used += size[w]
        while True:  # no tie for third place (the answer would be ambiguous); swaps may lengthen the text: trim
            c = Counter(drawn).most_common(4)
            if len(c) == 4 and c[2][1] == c[3][1]:
                drawn[len(drawn) - 1 - drawn[::-1].index(c[3][0])] = c[2][0]
                continue
            if sum(size[w] for w in drawn) <= room:
                break
            drawn.pop()
        ids = head + [t for w in drawn for t in src.encode(f" {w}")]
        top = [w for w, _ in Counter(drawn).most_common(3)]
        question = self.question(src, q_text, top)
        return Sample(self.name, ids, (question,))


def samples_for(lm, name: str, *, length: int, count: int, seed: int = 0, data: str = "imdb") -> list[Sample]:
    """``count`` samples of task ``name`` at ``length`` tokens for a loaded LM (its tokenizer and start token),
    the haystack from the fixed test split of ``data``."""
    from . import load, split

    texts = split(load(data), seed=0).test.texts
    return make_task(name).make(
        lambda t: lm.encode(t, special=False), texts, length=length, count=count, seed=seed, start=lm.encode("")[:1]
    )


__all__ = ["MAX_SAMPLES", "Question", "RulerTask", "Sample", "TASKS", "make_task", "samples_for", "score", "task"]
