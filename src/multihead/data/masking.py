"""BERT's masked-language-model corruption (Devlin et al. 2019, section 3.1 and appendix A.1).

Of the tokens that may be predicted (not special, not padding), each is *selected* with probability ``prob``
(15%); a selected token becomes ``[MASK]`` with probability 0.8, a random vocabulary token with 0.1, and stays as it
is with 0.1 -- the model must predict it in all three cases, so it cannot learn that only ``[MASK]`` positions
matter. Labels are the original ids at selected positions and ``-100`` (``F.cross_entropy``'s ``ignore_index``)
elsewhere, so the loss counts selected positions only.

Whole-word masking (the later BERT release's option) selects *words* with probability ``prob`` and corrupts every
piece of a selected word: with our tokenizer a word starts at a token whose text begins with ``▁``.

Randomness comes from an explicit ``torch.Generator``: a run seeds one per step, so the masks of step *n* are the
same whether or not the run was interrupted and resumed before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE = -100


def word_starts(tokenizer) -> Tensor:
    """``(V,)`` bool: token ``i`` begins a word (its text starts with the ``▁`` marker, or it is a special token)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    out = torch.zeros(max(vocab.values()) + 1, dtype=torch.bool)
    for token, i in vocab.items():
        out[i] = token.startswith("▁") or (token.startswith("[") and token.endswith("]"))
    return out


def mask_tokens(
    ids: Tensor,
    *,
    maskable: Tensor,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    prob: float = 0.15,
    replace: tuple[float, float] = (0.8, 0.1),
    word_start: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``ids (B, L)`` -> ``(inputs, labels)``: BERT's 80/10/10 corruption of a ``prob`` share of ``maskable``
    positions (bool ``(B, L)``). ``replace = (p_mask, p_random)``: of the selected positions, ``p_mask`` become
    ``mask_id`` and ``p_random`` a uniform random id in ``[0, vocab_size)``; the rest keep their token. With
    ``word_start`` (bool ``(V,)``, see :func:`word_starts`) whole words are selected: every maskable piece of a
    selected word shares its first piece's draw."""
    if ids.dim() != 2 or maskable.shape != ids.shape:
        raise ValueError(
            f"ids must be (B, L) and maskable the same shape; got {tuple(ids.shape)} and {tuple(maskable.shape)}"
        )
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must be in (0, 1), got {prob}")
    p_mask, p_random = replace
    if p_mask < 0 or p_random < 0 or p_mask + p_random > 1:
        raise ValueError(f"replace=(p_mask, p_random) must be non-negative with a sum <= 1, got {replace}")
    draw = torch.rand(ids.shape, generator=generator)
    if word_start is not None:
        starts = word_start[ids] | ~maskable  # a special token ends the word before it
        draw = draw.gather(1, _first_index(starts))  # every piece takes its word's first piece's draw
    selected = (draw < prob) & maskable
    how = torch.rand(ids.shape, generator=generator)
    to_mask = selected & (how < p_mask)
    to_random = selected & (how >= p_mask) & (how < p_mask + p_random)
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    inputs = ids.masked_fill(to_mask, mask_id)
    inputs = torch.where(to_random, random_ids, inputs)
    labels = ids.masked_fill(~selected, IGNORE)
    return inputs, labels


def _first_index(starts: Tensor) -> Tensor:
    """For each position, the column of the first piece of its word: the last start at or before it."""
    cols = torch.arange(starts.shape[1]).expand_as(starts)
    at_start = torch.where(starts, cols, torch.zeros_like(cols))
    return at_start.cummax(1).values


__all__ = ["IGNORE", "mask_tokens", "word_starts"]
