"""The protocol an attention module speaks to one layer's KV cache (:class:`LayerCache`, as HF's ``Cache.update``),
and what a cache answers: the :class:`KVView` s to attend.

Shape legend: ``B`` batch (beams included), ``H`` query heads, ``G`` key/value heads, ``Q`` query positions of a call,
``N`` cached positions, ``D`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from ...attention.attn_mask import AttnMask


@dataclass
class KVView:
    """What one group of query heads attends after a cache call: keys and values ``(B, G', N, D)`` (rotated),
    their ``mask`` (the call's own, or one made from the kept keys' positions) and ``heads``, the query heads that
    read them (None: every head; a head-aware policy gives each group of heads its own keys)."""

    k: Tensor
    v: Tensor
    mask: AttnMask | Tensor | None = None
    heads: Tensor | None = None


def attend_groups(q: Tensor, views: list[KVView], *, backend: str, scale=None, sinks: Tensor | None = None) -> Tensor:
    """``z`` ``(B, H, Q, D)`` of views that each give a group of query heads its own keys (a head-aware policy): the
    kernel seam on each group's heads, the outputs put back in head order. ``sinks``: the layer's ``(H,)`` logits."""
    from ...attention.registry import attention

    z = torch.empty_like(q)
    for view in views:
        assert view.heads is not None  # several views: each names its heads
        qg = q.index_select(1, view.heads)
        gs = None if sinks is None else sinks.to(q.dtype)[view.heads]
        z[:, view.heads], _ = attention(qg, view.k, view.v, mask=view.mask, scale=scale, backend=backend, sinks=gs)
    return z


@runtime_checkable
class LayerCache(Protocol):
    """What an attention module asks of one layer's cache, whatever it keeps. A new kind of cache implements these
    and plugs in where a model makes its caches (a policy's :meth:`~multihead.modules.kv.KVPolicy.layer_cache`).

    - :meth:`source`: a cross-attention cache's stored keys and values, so that the source is not projected again
      (None: project the call's and :meth:`update`);
    - :meth:`update`: this call's queries, keys and values in (unrotated); the queries (rotated where the cache places
      positions) and the views to attend out;
    - :meth:`done`: the call has attended its views (a policy scores and evicts there);
    - :meth:`reorder`: keep rows ``index`` (beam search: each surviving beam's parent);
    - :attr:`length`: the most positions any head holds; :meth:`nbytes`, :meth:`kv_nbytes`: bytes held, and bytes of
      the keys and values as filled."""

    @property
    def length(self) -> int: ...

    def source(self) -> tuple[Tensor, Tensor] | None: ...

    def update(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask=None, rotary=None, positions=None
    ) -> tuple[Tensor, list[KVView]]: ...

    def done(self, q: Tensor, views: list[KVView], sinks: Tensor | None = None) -> None: ...

    def reorder(self, index: Tensor) -> None: ...

    def nbytes(self) -> int: ...

    def kv_nbytes(self) -> int: ...


@runtime_checkable
class RecordedLayer(Protocol):
    """A layer cache that recorded its prompt (every key, and the attention sums the policies read), so that any
    policy can be applied to it afterwards: :meth:`compressed` answers the layer cache ``policy`` would have left
    after the prompt (``layer`` of ``num_layers``), leaving this one as it is."""

    def compressed(self, policy, layer: int, num_layers: int, *, prompt_only: bool = False) -> LayerCache: ...


__all__ = ["KVView", "LayerCache", "RecordedLayer", "attend_groups"]
