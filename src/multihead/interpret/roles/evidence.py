"""Is it a determiner -> noun head, or a next-token head? A test on sentences built to tell them apart.

On "The cat sat on the mat." every determiner's noun is also the next token, so a head that only attends one
position ahead looks like a grammar head there. This test reads held-out sentences where the noun is *never* the
next token ("Yesterday the big black cat sat on the old mat.": one or two adjectives between each determiner and
its noun; no determiner first, where a head that reads the first word would match) and scores every head on both
hypotheses:

* ``noun``: the share of determiners whose strongest link to another word is their own noun (from the determiner;
  in a causal model, which cannot look ahead, from the noun back to its determiner);
* ``adjacent``: the share whose strongest link is the next word instead (causal: the previous word).

A head passes as a determiner -> noun head when ``noun >= PASS`` and ``noun > adjacent``: where the two hypotheses
predict different words, it follows the noun. :func:`determiner_noun_test` scores every head and picks the best one
that passes (or none); ``explain`` and the demo open on it and say which test it passed.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch

from .case_study import word_positions
from ..maps import Subject, is_special

PASS = 0.5  # at least half of the determiners' strongest links go to their noun (and more than to the next word)

_OPENERS = ("yesterday", "today", "then", "suddenly", "later", "again")
_DETERMINERS = ("the", "a", "this", "that", "every", "one")
_ADJECTIVES = ("big", "small", "old", "black", "white", "red", "quiet", "tired", "happy", "wooden", "heavy", "green")
_SUBJECTS = ("cat", "dog", "man", "woman", "child", "bird", "horse", "teacher", "farmer", "girl", "boy", "doctor")
_VERBS = ("sat", "slept", "waited", "stood", "jumped", "rested", "danced", "walked")
_PREPOSITIONS = ("on", "under", "near", "behind", "beside", "by")
_OBJECTS = ("mat", "table", "chair", "bed", "wall", "tree", "door", "bench", "box", "rug", "fence", "car")


def separating_sentences(n: int = 24, seed: int = 0) -> list[tuple[str, list[str], list[tuple[int, int]]]]:
    """``n`` sentences ``adverb det adj [adj] noun verb prep det adj [adj] noun .`` with their words and the
    (determiner, noun) word positions: no noun is ever the next word after its determiner, and no determiner is the
    first word (a head that always reads the first word must not pass as a grammar head). Fixed by ``seed``; not
    the tutorial's sentence."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words: list[str] = [rng.choice(_OPENERS)]
        pairs = []
        for nouns, tail in ((_SUBJECTS, [rng.choice(_VERBS), rng.choice(_PREPOSITIONS)]), (_OBJECTS, [])):
            det = len(words)
            words.append(rng.choice(_DETERMINERS))
            words += rng.sample(_ADJECTIVES, rng.choice((1, 2)))
            pairs.append((det, len(words)))
            words.append(rng.choice(nouns))
            words += tail
        words.append(".")
        words[0] = words[0].capitalize()
        text = " ".join(words[:-1]) + "."
        out.append((text, [w.lower() for w in words], pairs))
    return out


@dataclass
class RoleTest:
    """Every head's scores on the separating sentences and the head that passes best (``None``: no head passes)."""

    name: str
    rule: str
    sentences: list[str]
    links: int  # determiner-noun pairs scored
    noun: list[list[float]]  # (layers, heads): share of links whose strongest word link is the noun
    adjacent: list[list[float]]  # (layers, heads): share whose strongest word link is the adjacent word
    passed: tuple[int, int] | None
    causal: bool

    def score(self, layer: int, head: int) -> dict:
        return {"noun": self.noun[layer][head], "adjacent": self.adjacent[layer][head]}

    def describe(self, layer: int, head: int) -> str:
        """One line for a page or a log: the head's scores and whether it passed."""
        s = self.score(layer, head)
        verdict = "passes" if self.passes(layer, head) else "does not pass"
        direction = "its noun's strongest link is the determiner" if self.causal else "its strongest link is the noun"
        return (
            f"layer {layer} head {head} {verdict} the determiner -> noun test: on {len(self.sentences)} held-out "
            f"sentences where the noun is never the next word ({self.links} determiners), {direction} "
            f"{s['noun']:.0%} of the time, the {'previous' if self.causal else 'next'} word {s['adjacent']:.0%}"
        )

    def passes(self, layer: int, head: int) -> bool:
        s = self.score(layer, head)
        return s["noun"] >= PASS and s["noun"] > s["adjacent"]

    def best(self, layer: int | None = None) -> tuple[int, int] | None:
        """The passing head with the highest noun share (in ``layer`` if given), or None."""
        heads = [(l, h) for l in range(len(self.noun)) for h in range(len(self.noun[l])) if layer in (None, l)]
        passing = [c for c in heads if self.passes(*c)]
        return max(passing, key=lambda c: self.noun[c[0]][c[1]]) if passing else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = list(self.passed) if self.passed else None
        return d


def determiner_noun_test(subject: Subject, n: int = 24, seed: int = 0) -> RoleTest:
    """Score every head of ``subject`` on :func:`separating_sentences` (see the module docstring)."""
    built = separating_sentences(n, seed)
    maps = subject.maps([t for t, _, _ in built])
    causal = all(bool((torch.triu(w, 1) == 0).all()) for w in maps[0].layers)
    layers = len(maps[0].layers)
    noun = [torch.zeros(w.shape[0]) for w in maps[0].layers]
    adjacent = [torch.zeros(w.shape[0]) for w in maps[0].layers]
    links = 0
    for m, (_, words, pairs) in zip(maps, built):
        pos = word_positions(m, words)
        if pos is None:  # a tokenizer that does not split these words as written: skip the sentence
            continue
        ordinary = torch.tensor([not is_special(t) for t in m.tokens])
        for det, nn_ in pairs:
            if causal:  # from the noun back: its determiner, or the word just before it
                query, want, near = pos[nn_], pos[det], pos[nn_ - 1]
            else:  # from the determiner: its noun, or the word just after it
                query, want, near = pos[det], pos[nn_], pos[det + 1]
            links += 1
            for l in range(layers):
                row = m.layers[l][:, query].clone()  # (H, L)
                row[:, ~ordinary] = -1.0  # special tokens are not words
                row[:, query] = -1.0  # nor is the word itself
                top = row.argmax(-1)
                noun[l] += (top == want).float()
                adjacent[l] += (top == near).float()
    if links == 0:
        raise ValueError(f"{subject.name}'s tokenizer does not split the test sentences into their words")
    noun_share = [(v / links).tolist() for v in noun]
    adjacent_share = [(v / links).tolist() for v in adjacent]
    test = RoleTest(
        name=subject.name,
        rule=f"noun >= {PASS} and noun > adjacent",
        sentences=[t for t, _, _ in built],
        links=links,
        noun=[[round(v, 4) for v in row] for row in noun_share],
        adjacent=[[round(v, 4) for v in row] for row in adjacent_share],
        passed=None,
        causal=causal,
    )
    test.passed = test.best()
    return test


__all__ = ["PASS", "RoleTest", "determiner_noun_test", "separating_sentences"]
