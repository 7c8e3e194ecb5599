"""Unlabelled text for pretraining: a seeded held-out share of the texts, the texts packed into fixed-length rows, and
the rows each optimizer step reads (a pure function of the step, so a resumed run reads the same rows)."""

from __future__ import annotations

import random

import torch

from .datasets import DataError
from .splits import Splits


def split_texts(n: int, *, validation: float, seed: int) -> dict:
    """A seeded share ``validation`` of ``n`` texts held out, by text: ``{"seed", "n", "validation": indices}``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = max(1, round(n * validation))
    return {"seed": seed, "n": n, "validation": sorted(order[:k])}


def apply_text_split(texts: list[str], record: dict, name: str = "") -> Splits:
    """The recorded held-out split of ``texts`` (:func:`split_texts`): a :class:`Splits` of text lists, no test part."""
    held = set(record["validation"])
    return Splits(
        [t for i, t in enumerate(texts) if i not in held],
        [t for i, t in enumerate(texts) if i in held],
        None,
        record,
        name,
    )


def pack(
    ids: list[list[int]], seq_len: int, sep_id: int, cls_id: int | None = None, *, option: str = "--seq-len"
) -> torch.Tensor:
    """Texts' ids -> ``(N, seq_len)`` rows cut from the texts joined by ``[SEP]`` (the tail shorter than a row is
    dropped). With ``cls_id`` each row is ``[CLS] ... [SEP]`` (BERT's input form), otherwise the stream as it comes
    (a causal LM reads ``[SEP]`` as end of text)."""
    body = seq_len - 2 if cls_id is not None else seq_len
    stream = torch.tensor([t for text in ids for t in (*text, sep_id)], dtype=torch.int32)
    n = len(stream) // body
    if n == 0:
        raise DataError(
            f"the texts hold {len(stream)} tokens, fewer than one row of {seq_len} ({option}); give "
            f"more text or a smaller {option}"
        )
    rows = stream[: n * body].view(n, body)
    if cls_id is None:
        return rows
    return torch.cat(
        [torch.full((n, 1), cls_id, dtype=torch.int32), rows, torch.full((n, 1), sep_id, dtype=torch.int32)], 1
    )


def row_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 7919 + epoch).shuffle(order)
    return order


def batch_rows(step: int, n_rows: int, batch_size: int, seed: int) -> list[int]:
    """The rows of global step ``step``: passes over the shuffled rows, ``batch_size`` at a time (a pass's tail
    shorter than a batch is skipped); a pure function of its arguments, so a resumed run reads the same rows."""
    per_pass = max(1, n_rows // batch_size)
    epoch, b = divmod(step, per_pass)
    order = row_order(n_rows, seed, epoch)
    return order[b * batch_size : (b + 1) * batch_size]


__all__ = ["apply_text_split", "batch_rows", "pack", "row_order", "split_texts"]
