"""Record what every attention layer does, through the hook points of :class:`~multihead.MultiHeadAttention`.

::

    with capture(model) as cache:            # per-head weights of every layer
        model(input_ids, attention_mask)
    cache.pattern(0)                         # (B, H, Lq, Lk) of the first attention module
    cache["encoder.layers.3.attn.hook_z"]    # any captured hook point by name

    logits, cache = run_with_cache(model, input_ids, attention_mask, what=("pattern", "q", "k", "v", "z"))

Nothing is attached outside the ``with`` block, so an un-captured model pays nothing. While ``pattern`` is captured,
each attention module computes its weights explicitly (``softmax(q k^T / sqrt(d) + mask)`` in fp32, the reference
backend's formula) and applies them, whatever backend it is set to: fused backends return no weights, and this is
how weights are obtained from them. Outputs agree with the un-captured run to rounding (tested).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

from .anatomy import anatomy, token_embedding

WHAT = {
    "pattern": "hook_pattern",
    "q": "hook_q",
    "k": "hook_k",
    "v": "hook_v",
    "z": "hook_z",
    "stats": "hook_stats",
    "result": "hook_result",
    "resid": "hook_resid_post",
}


class Cache(dict):
    """Captured activations by hook-point name (``encoder.layers.0.attn.hook_pattern``), detached, in call order.
    ``attention_modules`` lists the names of the model's attention modules in layer order."""

    def __init__(self, attention_modules: list[str]):
        super().__init__()
        self.attention_modules = attention_modules
        self.blocks: dict[str, str] = {}  # attention module -> the block whose residual stream was captured

    def get_layer(self, what: str, layer: int) -> Tensor:
        owner = self.attention_modules[layer]
        name = f"{self.blocks.get(owner, owner.rsplit('.', 1)[0]) if what == 'resid' else owner}.{WHAT[what]}"
        if name not in self:
            raise KeyError(
                f"{name} was not captured; capture with what=({what!r}, ...) and run the model inside the with-block"
            )
        return self[name]

    def pattern(self, layer: int) -> Tensor:
        """Per-head weights ``(B, H, Lq, Lk)`` of attention module ``layer``."""
        return self.get_layer("pattern", layer)

    def stats(self, layer: int):
        """:class:`~multihead.attention.stats.AttentionStats` of attention module ``layer`` (``what=("stats",)``)."""
        return self.get_layer("stats", layer)

    def patterns(self) -> list[Tensor]:
        """Every layer's ``(B, H, Lq, Lk)`` weights, in layer order."""
        return [self.pattern(i) for i in range(len(self.attention_modules))]


def attention_modules(model: nn.Module) -> list[tuple[str, Any]]:
    """``(name, module)`` of every attention site of ``model`` in layer order (:func:`~.anatomy.anatomy`): each
    module carries the site's hook points."""
    return [(s.name, s.module) for s in anatomy(model).sites]


@contextmanager
def capture(
    model: nn.Module,
    what: Iterable[str] = ("pattern",),
    *,
    layers: Iterable[int] | None = None,
    to_cpu: bool = True,
    stats: dict | None = None,
) -> Iterator[Cache]:
    """Record ``what`` of every attention module (or those in ``layers``, indices in layer order) during the forward
    passes run inside the block, only what is asked; a second forward pass overwrites the first one's entries:

    * ``pattern``, ``q``, ``k``, ``v``, ``z`` -- the module's hook points (weights ``(B, H, Lq, Lk)``, rotated
      queries and keys, values, per-head outputs ``(B, H, Lq, D)``);
    * ``result`` -- what each head writes into the residual stream, ``z_h W_O^h``, ``(B, H, Lq, E)`` (before
      ``head_mask``; summed over heads plus the output bias it is the module's output; not for gated heads);
    * ``resid`` -- the residual stream after the block holding the module (its ``hook_resid_post``, ``(B, L, E)``);
    * ``stats`` -- each call's exact per-head statistics (:func:`~multihead.attention.stats.attention_stats`,
      options from ``stats=``, e.g. ``{"topk": 8}``) without building any ``Lq x Lk`` map: the way to look at long
      inputs."""
    what = list(what)
    bad = [w for w in what if w not in WHAT]
    if bad:
        raise ValueError(f"cannot capture {bad}; choose from {sorted(WHAT)}")
    body = anatomy(model)
    mods: list[tuple[str, Any]] = [(s.name, s.module) for s in body.sites]
    cache = Cache([n for n, _ in mods])
    chosen = range(len(mods)) if layers is None else list(layers)
    handles, options, blocks_seen = [], {}, set()

    def recorder(key: str, transform=None):
        def record(t, hook) -> None:
            if isinstance(t, Tensor):
                t = t.detach() if transform is None else transform(t.detach())
                t = t.cpu() if to_cpu else t
            cache[key] = t  # stats: an AttentionStats (computed without autograd)

        return record

    try:
        for i in chosen:
            name, mod = mods[i]
            if "stats" in what:
                options[mod] = mod.stats_options
                mod.stats_options = dict(stats or {})
            for w in what:
                if w == "resid":
                    block = body.site_block(i)
                    cache.blocks[name] = block.name
                    key = f"{block.name}.hook_resid_post"
                    if key not in blocks_seen:  # a decoder block holds two attention modules
                        blocks_seen.add(key)
                        handles.append(block.hook("hook_resid_post").add_hook(recorder(key)))
                elif w == "result":
                    if getattr(mod, "w_gate", None) is not None:
                        raise ValueError(
                            f"{name} has gated heads: what a head writes depends on the gate's input too;"
                            " capture z instead"
                        )
                    w_o = mod.w_o.weight.detach()

                    def per_head(z: Tensor, w_o=w_o) -> Tensor:
                        return torch.einsum("bhld,ehd->bhle", z, w_o.view(w_o.shape[0], z.shape[1], z.shape[3]))

                    handles.append(mod.hook_z.add_hook(recorder(f"{name}.hook_result", per_head)))
                else:
                    handles.append(getattr(mod, WHAT[w]).add_hook(recorder(f"{name}.{WHAT[w]}")))
        yield cache
    finally:
        for h in handles:
            h.remove()
        for mod, opts in options.items():
            mod.stats_options = opts


def run_with_cache(model: nn.Module, *args, what: Iterable[str] = ("pattern",), **kwargs):
    """``(model(*args, **kwargs), cache)`` with ``what`` captured (TransformerLens' ``run_with_cache``)."""
    with capture(model, what) as cache, torch.no_grad():
        out = model(*args, **kwargs)
    return out, cache


__all__ = ["Cache", "attention_modules", "capture", "run_with_cache", "token_embedding"]
