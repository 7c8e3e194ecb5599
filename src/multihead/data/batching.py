"""Length-bucketed batches with dynamic padding: each batch is padded only to its own longest sequence."""

from __future__ import annotations

import random

import torch


def bucketed_batches(
    lengths: list[int], batch_size: int, *, seed: int, epoch: int, shuffle: bool = True, bucket_factor: int = 50
) -> list[list[int]]:
    """Batches of indices: shuffle, cut into pools of ``batch_size * bucket_factor``, sort each pool by length,
    batch it, shuffle the batches. Deterministic in ``(seed, epoch)``, so an interrupted epoch can be replayed."""
    idx = list(range(len(lengths)))
    if not shuffle:
        idx.sort(key=lambda i: lengths[i])
        return [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]
    rng = random.Random(seed * 1_000_003 + epoch)
    rng.shuffle(idx)
    pool = batch_size * bucket_factor
    batches = []
    for start in range(0, len(idx), pool):
        chunk = sorted(idx[start : start + pool], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def length_sorted(ids: list[list[int]], batch_size: int, *, pad_id: int = 0):
    """Inference batches over sequences of similar length (little padding): yields ``(indices, input_ids (B, L),
    mask (B, L))`` with ``indices`` the positions in ``ids``; every index appears once, shortest batches first."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        x, mask = collate([ids[i] for i in chunk], pad_id=pad_id)
        yield chunk, x, mask


def as_batch(ids) -> torch.Tensor:
    """One sequence of token ids (a list) as the one-row batch ``(1, L)`` models take."""
    return torch.tensor([list(ids)], dtype=torch.long)


def collate(ids: list[list[int]], pad_id: int = 0, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, L)`` token ids padded with ``pad_id`` and the bool mask ``(B, L)``, True = real token. ``left=True``
    pads on the left (prompts for generation: every row's last column is real)."""
    width = max(len(x) for x in ids)
    batch = torch.full((len(ids), width), pad_id, dtype=torch.long)
    for row, x in enumerate(ids):
        if len(x):
            start = width - len(x) if left else 0
            batch[row, start : start + len(x)] = torch.tensor(x, dtype=torch.long)
    lengths = torch.tensor([len(x) for x in ids])
    mask = torch.arange(width)[None, :] < lengths[:, None]  # (B, L)
    return batch, (mask.flip(-1) if left else mask)
