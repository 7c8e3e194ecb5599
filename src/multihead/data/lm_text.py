"""Held-out text as token rows for a pretrained LM: the fixed test split of a built-in dataset (IMDB reviews by
default), encoded with the model's own tokenizer, cut into rows of an exact length. Perplexity, head importance,
patching benchmarks and the KV-policy curves all read their text here, so they read the same text."""

from __future__ import annotations

import torch
from torch import Tensor


def held_out_rows(lm, *, rows: int, length: int, data: str = "imdb", skip: int = 0) -> Tensor:
    """``(rows, length)`` token ids of the fixed test split of ``data`` (IMDB reviews by default), texts joined
    with a blank line and cut into rows, each starting with the start token where the model's tokenizer adds one
    (SmolLM2's does not); ``skip`` rows are
    passed over first (so that scoring and judging use different text)."""
    from .. import data as D

    ds = D.load(data)
    texts = D.split(ds, seed=0).test.texts
    bos = lm.encode("")[:1]  # the start token where the model's tokenizer adds one
    body = length - len(bos)
    need = (rows + skip) * body
    ids: list[int] = []
    for text in texts:
        ids += lm.encode(text.replace("<br />", "\n") + "\n\n", special=False)
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise ValueError(
            f"the {data} test split holds {len(ids):,} tokens, fewer than {need:,}; ask for fewer rows "
            "or a shorter length"
        )
    cut = torch.tensor(ids[skip * body : need]).view(rows, body)
    return torch.cat([torch.full((rows, len(bos)), bos[0], dtype=torch.long), cut], 1) if bos else cut


__all__ = ["held_out_rows"]
