"""Structured sparsity patterns for self-attention: one object that sparse backends run natively and that can also
build the equivalent dense mask (so every sparse backend is tested against the reference under that mask).

* ``window=w``: query ``i`` may attend keys ``j`` with ``|i - j| <= w * dilation`` and ``(i - j) % dilation == 0``
  (``causal=True``: only ``j <= i``) -- Longformer's sliding window, with dilation;
* ``global_tokens=(0, ...)``: those positions attend to every key and every query attends to them (Longformer);
* ``block=b`` (BigBird): the sequence is cut into blocks of ``b``; each query block attends to its
  ``window_blocks`` neighbours on each side, the first ``global_blocks`` blocks, and ``random_blocks`` other blocks
  drawn with ``seed``; the global blocks attend to everything.

A pattern is geometry only: key padding travels beside it in :class:`~multihead.attention.attn_mask.AttnMask`
(``AttnMask(pattern=p, key_padding=keep)``). Patterns describe square self-attention (``Lq == Lk``).

Each rule is written once, as a function of query and key *positions* (:meth:`SparsePattern.rule`, and
:func:`window_band` for the band itself): the dense mask, FlexAttention's ``mask_mod`` and the sparse kernels' tiles
all evaluate it on their own index tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .masks import causal_allowed


def window_band(d: Tensor, window: int, dilation: int = 1) -> Tensor:
    """The sliding-window rule on query-minus-key distances ``d``: ``|d| <= window * dilation`` and ``d`` a
    multiple of ``dilation`` (Longformer). Without dilation the modulo is left out: inside FlexAttention's kernel
    every op of the rule runs per pair of a partial tile."""
    if dilation == 1:
        return d.abs() <= window
    return (d.abs() <= window * dilation) & (d % dilation == 0)


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

    @property
    def window_size(self) -> int:
        """The window of a sliding-window pattern (``window``, checked to be set)."""
        if self.window is None:
            raise ValueError("this SparsePattern is block-sparse; it has no window")
        return self.window

    @property
    def block_size(self) -> int:
        """The block of a block-sparse pattern (``block``, checked to be set)."""
        if self.block is None:
            raise ValueError("this SparsePattern is a sliding window; it has no block")
        return self.block

    def with_causal(self, causal: bool = True) -> SparsePattern:
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

    def rule(self, length: int, device=None):
        """``allowed(i, j) -> bool tensor`` for query positions ``i`` and key positions ``j`` (any broadcastable
        index tensors) of a length-``length`` sequence: the one definition of this pattern."""
        if self.kind == "window":
            g = torch.zeros(length, dtype=torch.bool, device=device)
            g[[t for t in self.global_tokens if 0 <= t < length]] = True
            w, dil = self.window_size, self.dilation

            def allowed(i, j):
                ok = window_band(i - j, w, dil)
                return (ok | g[i] | g[j]) if self.global_tokens else ok
        else:
            layout, bs = self.block_layout(-(-length // self.block_size)).to(device), self.block_size

            def allowed(i, j):
                return layout[i // bs, j // bs]

        if not self.causal:
            return allowed
        return lambda i, j: allowed(i, j) & causal_allowed(i, j, 0)

    def dense(self, length: int, device=None) -> Tensor:
        """The equivalent dense mask ``(L, L)`` bool (True = may attend)."""
        i = torch.arange(length, device=device)
        return self.rule(length, device)(i[:, None], i[None, :])

    def density(self, length: int) -> float:
        return float(self.dense(length).float().mean())


def as_pattern(spec: dict | SparsePattern | None) -> SparsePattern | None:
    if spec is None or isinstance(spec, SparsePattern):
        return spec
    d = dict(spec)
    if "global_tokens" in d:
        d["global_tokens"] = tuple(d["global_tokens"])
    return SparsePattern(**d)


__all__ = ["SparsePattern", "as_pattern"]
