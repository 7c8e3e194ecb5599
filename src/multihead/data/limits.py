"""The one meaning of ``data.limit`` in every task: keep at most ``n`` training items, a seeded random choice,
stratified by label where the items have labels (each class keeps its share of the ``n``), in their original order.
Validation and test stay whole unless ``data.eval_limit`` cuts them the same way (a smaller model is then compared on
the same held-out items as the full one). Pretraining, which has no test part, cuts the texts it reads.

Text classification, grapheme-to-phoneme (words, no labels), pretraining (texts, no labels), images and grounding
all cut their splits with :func:`limit_indices`; the run folder's ``splits.json`` records the cut
(:func:`limit_record`), so a reader of the folder knows which examples a smoke run saw.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence


def limit_indices(n: int, keep: int | None, seed: int, labels: Sequence[int] | None = None) -> list[int]:
    """Indices of at most ``keep`` of ``n`` items (all of them when ``keep`` is None or >= ``n``), sorted. With
    ``labels`` the choice is stratified: class ``c`` keeps ``keep * n_c / n`` items, rounded by largest remainder
    (so every class present keeps at least one while ``keep`` >= the number of classes)."""
    if keep is None or keep >= n:
        return list(range(n))
    if keep < 0:
        raise ValueError(f"limit must be >= 0, got {keep}")
    rng = random.Random(seed)
    if labels is None:
        return sorted(rng.sample(range(n), keep))
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} items")
    by_class: dict[int, list[int]] = defaultdict(list)
    for i, y in enumerate(labels):
        by_class[int(y)].append(i)
    classes = sorted(by_class)
    exact = {c: keep * len(by_class[c]) / n for c in classes}
    quota = {c: int(exact[c]) for c in classes}
    short = keep - sum(quota.values())
    for c in sorted(classes, key=lambda c: (-(exact[c] - quota[c]), c))[:short]:  # largest remainders first
        quota[c] += 1
    chosen = [i for c in classes for i in rng.sample(by_class[c], quota[c])]
    return sorted(chosen)


def limit_record(keep: int | None, seed: int, stratified: bool, eval_keep: int | None = None) -> dict | None:
    """What ``splits.json`` says about the cut (None: no limit): at most ``train`` training items and ``evaluation``
    items of each held-out part (None: all of them)."""
    if keep is None and eval_keep is None:
        return None
    return {"train": keep, "evaluation": eval_keep, "seed": seed, "stratified_by_label": stratified}


__all__ = ["limit_indices", "limit_record"]
