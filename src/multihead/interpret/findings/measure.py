"""One forward pass, measured per layer through the model's anatomy: what the sink findings read.

:func:`measure` runs token ids ``(B, L)`` once and records, per attention site (layer):

* ``share``: the attention on the first token (mean over heads, rows and queries after the first), beside the same
  for the second token (``second``) and what uniform causal attention would give the first (``uniform``: the mean
  of ``1 / (q + 1)``): a sink is attention on the first token far above both;
* ``head_share`` ``(layers, heads)`` and ``sink_rate``: the share of heads whose first-token attention is at least
  ``threshold`` (0.3, as Gu et al. 2024 count sink heads);

and per block (the residual stream after it):

* ``norm_first`` and ``norm_rest``: the first token's hidden norm and the median of the others';
* ``entropy``: the matrix entropy of the stream ``Z`` ``(L, E)`` -- the Shannon entropy of its normalised squared
  singular values, over ``log(min(L, E))`` (1: every direction used alike; near 0: one direction, such as one
  token's massive activation, holds nearly all of the energy);

and ``loss``, the mean next-token loss at positions after the first. Interventions ride the same pass:
``remove_sink`` takes the first token's attention away from every later query (the rest renormalised), and
``edits`` maps a block index to a function that rewrites that block's output stream (ablating dimensions), or,
under the key ``("neurons", block)``, the input of its feed-forward's output projection (editing neurons).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...modules.anatomy import Anatomy, anatomy

SINK_THRESHOLD = 0.3


@dataclass
class Pass:
    """What :func:`measure` recorded (see the module docstring); per layer lists, means over the rows."""

    share: list[float] = field(default_factory=list)
    second: list[float] = field(default_factory=list)
    head_share: list[list[float]] = field(default_factory=list)
    sink_rate: list[float] = field(default_factory=list)
    norm_first: list[float] = field(default_factory=list)
    norm_rest: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    uniform: float = 0.0
    loss: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def matrix_entropy(z: Tensor) -> float:
    """The normalised matrix entropy of ``z`` ``(L, E)``: ``-sum p log p / log(min(L, E))`` with ``p`` its squared
    singular values over their sum (1: the energy spread over every direction; 0: one direction)."""
    z = z.double()
    s2 = torch.linalg.svdvals(z) ** 2
    p = s2 / s2.sum()
    p = p[p > 0]
    n = min(z.shape)
    return float(-(p * p.log()).sum() / math.log(n)) if n > 1 else 0.0


def uniform_first_share(length: int, key: int = 0) -> float:
    """Position ``key``'s attention under uniform causal attention, averaged over the queries after it."""
    return sum(1.0 / (q + 1) for q in range(key + 1, length)) / max(length - 1 - key, 1)


def measure(
    model,
    ids: Tensor,
    *,
    threshold: float = SINK_THRESHOLD,
    remove_sink: bool = False,
    edits: dict | None = None,
    loss: bool = True,
    key: int = 0,
) -> Pass:
    """One pass over ``ids`` ``(B, L)`` (``L >= 2``), measured per layer (module docstring). ``key``: the position
    whose attention ``share`` reads (default the first; ``second`` is then the position after it)."""
    a = anatomy(model)
    if not 0 <= key < ids.shape[1] - 1:
        raise ValueError(
            f"the sink measurements need a token after position {key}: rows of {ids.shape[1]} tokens are too short"
        )
    edits = edits or {}
    sites, blocks = a.sites, a.blocks
    share = torch.zeros(len(sites), dtype=torch.float64)
    second = torch.zeros(len(sites), dtype=torch.float64)
    heads = [torch.zeros(s.num_heads, dtype=torch.float64) for s in sites]
    norm_first = torch.zeros(len(blocks), dtype=torch.float64)
    norm_rest = torch.zeros(len(blocks), dtype=torch.float64)
    entropy = torch.zeros(len(blocks), dtype=torch.float64)
    handles = []

    def on_pattern(i: int) -> Callable:
        def hook(p: Tensor, _hook) -> Tensor | None:
            if p.shape[1] == 0:  # an empty layer (no heads)
                return None
            per_head = p[:, :, key + 1 :, key].double().mean(-1).sum(0)  # (H,): queries after the key, rows summed
            heads[i].add_(per_head)
            share[i] += per_head.mean()
            if p.shape[-1] > key + 2:
                second[i] += p[:, :, key + 2 :, key + 1].double().mean((-1, -2)).sum()
            return drop_key(p, key) if remove_sink else None

        return hook

    def on_stream(j: int) -> Callable:
        edit = edits.get(j)

        def hook(x: Tensor, _hook) -> Tensor | None:
            if edit is not None:
                x = edit(x)
            h = x.detach().double()
            norms = h.norm(dim=-1)  # (B, L)
            norm_first[j] += norms[:, 0].sum()
            norm_rest[j] += norms[:, 1:].median(-1).values.sum()
            entropy[j] += sum(matrix_entropy(row) for row in h)
            return x if edit is not None else None

        return hook

    try:
        for i, s in enumerate(sites):
            handles.append(s.module.hook_pattern.add_hook(on_pattern(i)))
        for j, b in enumerate(blocks):
            point = b.hook("hook_resid_post")
            if point is None:
                raise ValueError(f"{b.name} has no hook_resid_post: the residual stream after it cannot be read")
            handles.append(point.add_hook(on_stream(j)))
            neuron_edit = edits.get(("neurons", j))
            if neuron_edit is not None:
                handles.append(_edit_neurons(a, j, neuron_edit))
        with torch.no_grad():
            logits = a.logits(ids)
    finally:
        for h in handles:
            h.remove()
    rows = ids.shape[0]
    out = Pass(
        share=(share / rows).tolist(),
        second=(second / rows).tolist(),
        head_share=[(h / rows).tolist() for h in heads],
        sink_rate=[float(((h / rows) >= threshold).double().mean()) for h in heads],
        norm_first=(norm_first / rows).tolist(),
        norm_rest=(norm_rest / rows).tolist(),
        entropy=(entropy / rows).tolist(),
        uniform=uniform_first_share(ids.shape[1], key),
    )
    if loss:
        lp = logits[:, :-1].float().log_softmax(-1)
        out.loss = float(-lp.gather(-1, ids[:, 1:, None]).mean())
    return out


def drop_key(p: Tensor, key: int = 0) -> Tensor:
    """Attention weights ``(B, H, Lq, Lk)`` with key ``key`` taken from every later query, the rest renormalised."""
    p = p.clone()
    p[:, :, key + 1 :, key] = 0
    return p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


@contextmanager
def without_sink(model, key: int = 0) -> Iterator[None]:
    """Inside, every attention site of ``model`` gives key ``key`` no attention from the queries after it."""
    handles = [s.module.hook_pattern.add_hook(lambda p, _h: drop_key(p, key)) for s in anatomy(model).sites]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _edit_neurons(a: Anatomy, block: int, edit: Callable[[Tensor], Tensor]):
    """Rewrite the neurons' activations (the input of block ``block``'s feed-forward output projection)."""
    out = a.blocks[block].mlp_out
    if out is None:
        raise ValueError(f"{a.blocks[block].name}: {why_no_neurons(a, block)}")
    return out.register_forward_pre_hook(lambda m, args: (edit(args[0]), *args[1:]))


def why_no_neurons(a: Anatomy, block: int) -> str:
    """Why block ``block``'s feed-forward neurons cannot be read or edited (a model without them, experts, ...)."""
    b = a.blocks[block]
    if b.mlp is None:
        return "the block has no feed-forward network, so it has no neurons to read or edit"
    return (
        f"its feed-forward ({type(b.mlp).__name__}) has no single linear output projection reading one activation "
        "per neuron (experts, or a transposed Conv1D), so its neurons cannot be read or edited here"
    )


def neuron_activations(model, ids: Tensor, block: int) -> Tensor:
    """The activations ``(B, L, neurons)`` entering block ``block``'s feed-forward output projection."""
    a = anatomy(model)
    out = a.blocks[block].mlp_out
    if out is None:
        raise ValueError(f"{a.blocks[block].name}: {why_no_neurons(a, block)}")
    got: list[Tensor] = []
    handle = out.register_forward_pre_hook(lambda m, args: got.append(args[0].detach()))
    try:
        with torch.no_grad():
            a.logits(ids)
    finally:
        handle.remove()
    return got[0]


def stream(model, ids: Tensor) -> list[Tensor]:
    """The residual stream ``(B, L, E)`` after every block."""
    a = anatomy(model)
    got: list[Tensor] = []
    handles = [b.hook("hook_resid_post").add_hook(lambda x, h: got.append(x.detach())) for b in a.blocks]
    try:
        with torch.no_grad():
            a.logits(ids)
    finally:
        for h in handles:
            h.remove()
    return got


__all__ = [
    "SINK_THRESHOLD",
    "Pass",
    "drop_key",
    "matrix_entropy",
    "measure",
    "neuron_activations",
    "stream",
    "uniform_first_share",
    "why_no_neurons",
    "without_sink",
]
