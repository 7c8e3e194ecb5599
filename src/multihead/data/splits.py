"""The one split type of every task: :class:`Splits` -- train, validation and (where the task has one) test parts of
one kind, and the record ``splits.json`` keeps -- with the one meaning of ``data.limit``.

A part is anything with ``len()`` and ``subset(indices)``; parts with labels also answer ``label_ids()``. The tasks'
parts: a :class:`~multihead.data.datasets.TextDataset` (classification), an
:class:`~multihead.data.images.ImageSet` (the ViT and grounding), a :class:`~multihead.data.g2p.Lexicon`
(grapheme-to-phoneme) and a list of texts (pretraining, no test part). Shape legend: none (parts are sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar
from collections.abc import Iterator

from .limits import limit_indices, limit_record

T = TypeVar("T")
PARTS = ("train", "validation", "test")


@dataclass
class Splits(Generic[T]):
    """A task's data split: its parts, the record ``splits.json`` holds (seed, fractions, fingerprint, indices,
    the limit), and, for labelled data, the dataset's name and class names."""

    train: T
    validation: T
    test: T | None = None  # None: the task holds out only a validation part (pretraining)
    record: dict = field(default_factory=dict)
    name: str = ""
    label_names: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[T]:
        """The parts present, in the order train, validation, test."""
        return iter(part for _, part in self.items())

    def items(self) -> list[tuple[str, T]]:
        """``(name, part)`` for the parts present."""
        return [(n, getattr(self, n)) for n in PARTS if getattr(self, n) is not None]

    def __getitem__(self, name: str) -> T:
        if name not in PARTS or getattr(self, name) is None:
            raise KeyError(f"no {name!r} part; this split has {[n for n, _ in self.items()]}")
        return getattr(self, name)

    def limit(self, keep: int | None, seed: int, *, eval_keep: int | None = None) -> Splits[T]:
        """The one meaning of ``data.limit`` (:mod:`multihead.data.limits`): at most ``keep`` training items, and at
        most ``eval_keep`` items of the validation and test parts (None: all of them); a seeded choice, stratified by
        label where the parts have labels, in their original order; the cut is added to the record. Both None or 0:
        this split unchanged."""
        keep, eval_keep = keep or None, eval_keep or None
        if keep is None and eval_keep is None:
            return self
        labelled = hasattr(self.train, "label_ids")

        def cut(part, n):
            if part is None or n is None:
                return part
            return part.subset(limit_indices(len(part), n, seed, part.label_ids() if labelled else None))

        return replace(
            self,
            train=cut(self.train, keep),
            validation=cut(self.validation, eval_keep),
            test=cut(self.test, eval_keep),
            record={**self.record, "limit": limit_record(keep, seed, labelled, eval_keep)},
        )

    def sizes(self) -> dict[str, int]:
        return {n: len(p) for n, p in self.items()}


__all__ = ["PARTS", "Splits"]
