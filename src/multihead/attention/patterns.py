"""Structured sparsity patterns for self-attention: one object that sparse backends run natively and that can also
build the equivalent dense mask (so every sparse backend is tested against the reference under that mask).

* ``window=w``: query ``i`` may attend keys ``j`` with ``|i - j| <= w * dilation`` and ``(i - j) % dilation == 0``
  (``causal=True``: only ``j <= i``) -- Longformer's sliding window, with dilation;
* ``global_tokens=(0, ...)``: those positions attend to every key and every query attends to them (Longformer);
* ``block=b`` (BigBird): the sequence is cut into blocks of ``b``; each query block attends to its
  ``window_blocks`` neighbours on each side, the first ``global_blocks`` blocks, and ``random_blocks`` other blocks
  drawn with ``seed``; the global blocks attend to everything.

``key_padding`` (``(B, L)`` bool, True = real token) can be bound to a pattern with :meth:`SparsePattern.pad`.
Patterns describe square self-attention (``Lq == Lk``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class SparsePattern:
    window: int | None = None
    dilation: int = 1
    global_tokens: tuple[int, ...] = ()
    causal: bool = False
    block: int | None = None
    window_blocks: int = 1
    global_blocks: int = 1
    random_blocks: int = 0
    seed: int = 0
    key_padding: Tensor | None = None  # (B, L) bool, True = real token

    def __post_init__(self) -> None:
        if (self.window is None) == (self.block is None):
            raise ValueError("a SparsePattern is either a sliding window (window=) or block-sparse (block=)")
        if self.window is not None and self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window}")
        if self.dilation < 1:
            raise ValueError(f"dilation must be >= 1, got {self.dilation}")
        if self.block is not None and self.block < 1:
            raise ValueError(f"block must be >= 1, got {self.block}")

    @property
    def kind(self) -> str:
        return "window" if self.window is not None else "block"

    def pad(self, key_padding: Tensor | None) -> "SparsePattern":
        """This pattern restricted to real keys (``(B, L)`` bool, True = real token)."""
        return replace(self, key_padding=key_padding)

    def with_causal(self, causal: bool = True) -> "SparsePattern":
        return replace(self, causal=self.causal or causal)

    def block_layout(self, num_blocks: int) -> Tensor:
        """``(nb, nb)`` bool: which key blocks each query block attends (block-sparse patterns)."""
        nb = num_blocks
        idx = torch.arange(nb)
        lay = (idx[:, None] - idx[None, :]).abs() <= self.window_blocks
        g = min(self.global_blocks, nb)
        lay[:, :g] = True
        lay[:g, :] = True
        if self.random_blocks:
            gen = torch.Generator().manual_seed(self.seed)
            for i in range(g, nb):
                free = (~lay[i]).nonzero().flatten()
                if len(free):
                    pick = free[torch.randperm(len(free), generator=gen)[: self.random_blocks]]
                    lay[i, pick] = True
        if self.causal:
            lay &= idx[:, None] >= idx[None, :]
        return lay

    def dense(self, length: int, device=None) -> Tensor:
        """The equivalent dense mask: ``(L, L)`` bool, or ``(B, 1, L, L)`` with ``key_padding``."""
        i = torch.arange(length, device=device)[:, None]
        j = torch.arange(length, device=device)[None, :]
        if self.kind == "window":
            d = i - j
            m = (d.abs() <= self.window * self.dilation) & (d % self.dilation == 0)
            if self.global_tokens:
                g = torch.zeros(length, dtype=torch.bool, device=device)
                g[[t for t in self.global_tokens if t < length]] = True
                m = m | g[:, None] | g[None, :]
        else:
            nb = -(-length // self.block)
            lay = self.block_layout(nb).to(device)
            m = lay[i // self.block, j // self.block]
        if self.causal:
            m = m & (j <= i)
        if self.key_padding is not None:
            m = m[None, None] & self.key_padding[:, None, None, :].to(device)
        return m

    def density(self, length: int) -> float:
        return float(self.pad(None).dense(length).float().mean())


def as_pattern(spec: dict | SparsePattern | None) -> SparsePattern | None:
    if spec is None or isinstance(spec, SparsePattern):
        return spec
    d = dict(spec)
    if "global_tokens" in d:
        d["global_tokens"] = tuple(d["global_tokens"])
    return SparsePattern(**d)


__all__ = ["SparsePattern", "as_pattern"]
