"""Test-time registers (Jiang et al. 2025, "Vision Transformers Don't Need Trained Registers", arXiv 2506.08010),
measured through the model's anatomy on a ViT with a [CLS] token (token 0, the patches after it):

* **High-norm tokens**: per block and image, the largest patch norm of the residual stream over the median patch
  norm; a patch is an outlier where that ratio passes :data:`OUTLIER` (as :mod:`multihead.interpret.media.dino`
  counts them). The **outlier block** is the block of the largest mean ratio.
* **Register neurons**: the feed-forward neurons (of the blocks up to the outlier block) with the highest mean
  activation at each image's outlier patches (its highest-norm patch where none passes the threshold).
* **A test-time register**: one extra token of zeros appended after the embedding; at each register neuron, the
  activation of the register token is set to the neuron's largest activation over the patches, and zero at every
  other token (the activation moved, not removed).

Each condition is measured alike: the largest patch-norm ratio per block; the last layer's [CLS] attention (mean over
heads) on the outlier patches, on the register token, and on the object where a box is given. Beside the registers
with the chosen neurons: a bare extra token (nothing moved) and the same number of random neurons moved.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...modules.anatomy import anatomy
from .measure import why_no_neurons

OUTLIER = 4.0  # a patch is high-norm when its norm passes this many times the median patch norm (as dino counts)


@dataclass
class Seen:
    """What :func:`observe` recorded: per block the token norms ``(B, T)``, the last site's [CLS] attention ``(B,
    T)`` (mean over heads) and the feed-forward activations ``(B, T, F)`` of the blocks asked for. The measurements
    read one image per pass (``B = 1``), whose sizes may differ."""

    norms: list[Tensor] = field(default_factory=list)
    cls: Tensor | None = None
    acts: dict[int, Tensor] = field(default_factory=dict)


def _move(neurons: list[int]) -> Callable:
    def hook(module, args):
        act = args[0].clone()  # (B, T, F); the register is the last token
        act[:, -1, neurons] = act[:, 1:-1, neurons].amax(1)
        act[:, :-1, neurons] = 0
        return (act, *args[1:])

    return hook


@torch.no_grad()
def observe(model, images: Tensor, *, register: bool = False, moved: dict | None = None, acts_of=()) -> Seen:
    """One pass over ``images``; ``register``: one token of zeros appended after the embedding; ``moved``: ``{block:
    [neurons]}`` whose activations are moved onto it (module docstring)."""
    a = anatomy(model)
    seen = Seen(norms=[torch.empty(0)] * len(a.blocks))
    handles = []

    def norms(j: int) -> Callable:
        def hook(x: Tensor, _h) -> None:
            seen.norms[j] = x.detach().double().norm(dim=-1)

        return hook

    def cls(p: Tensor, _h) -> None:
        seen.cls = p[:, :, 0].detach().double().mean(1)

    def record(j: int) -> Callable:
        return lambda m, args: seen.acts.__setitem__(j, args[0].detach().double())

    def append(module, args):
        x = args[0]
        return (torch.cat([x, x.new_zeros(x.shape[0], 1, x.shape[2])], 1), *args[1:])

    if moved and not register:
        raise ValueError("neurons are moved onto the register token: pass register=True")
    try:
        if register:
            handles.append(a.blocks[0].module.register_forward_pre_hook(append))
        for j, b in enumerate(a.blocks):
            handles.append(b.hook("hook_resid_post").add_hook(norms(j)))
            out = b.mlp_out
            if (j in (moved or {}) or j in acts_of) and out is None:
                raise ValueError(f"{b.name}: {why_no_neurons(a, j)}")
            if j in acts_of:
                handles.append(out.register_forward_pre_hook(record(j)))
            if j in (moved or {}):
                handles.append(out.register_forward_pre_hook(_move(moved[j])))
        handles.append(a.sites[-1].module.hook_pattern.add_hook(cls))
        a.logits(images)
    finally:
        for h in handles:
            h.remove()
    return seen


def patch_ratio(seen: Seen, patches: int) -> Tensor:
    """``(blocks,)``: the largest patch norm over the median patch norm of one image, per block."""
    return torch.stack([n[0, 1 : 1 + patches].amax() / n[0, 1 : 1 + patches].median() for n in seen.norms])


def outliers(seen: Seen, block: int, patches: int) -> list[int]:
    """One image's outlier patches at ``block`` (indices among the patches): those past :data:`OUTLIER` x the
    median, else the single highest-norm patch."""
    n = seen.norms[block][0, 1 : 1 + patches]
    return (n > OUTLIER * n.median()).nonzero().flatten().tolist() or [int(n.argmax())]


def register_neurons(seen: list[Seen], where: list[list[int]], blocks: list[int], k: int) -> dict[int, list[int]]:
    """The ``k`` neurons of ``blocks`` with the highest mean activation at each image's outlier patches ``where``."""
    scores = []
    for j in blocks:
        mean = torch.stack([s.acts[j][0, 1:][w].mean(0) for s, w in zip(seen, where)]).mean(0)  # (F,)
        scores += [(float(v), j, n) for n, v in enumerate(mean)]
    scores.sort(reverse=True)
    out: dict[int, list[int]] = {}
    for _, j, n in scores[:k]:
        out.setdefault(j, []).append(n)
    return out


def _shares(seen: list[Seen], where: list[list[int]], patches: list[int], masks: list[Tensor] | None) -> dict:
    ratio, on_outliers, register, on_object = [], [], [], []
    for i, s in enumerate(seen):
        if s.cls is None:
            raise ValueError("the last attention site recorded no pattern: its [CLS] attention cannot be read")
        cls = s.cls[0]  # (T,)
        ratio.append(patch_ratio(s, patches[i]))
        on_outliers.append(float(cls[[1 + w for w in where[i]]].sum()))
        register.append(float(cls[-1]) if cls.shape[0] > 1 + patches[i] else 0.0)
        if masks is not None:
            over = cls[1 : 1 + patches[i]]
            on_object.append(float(over[masks[i].flatten()].sum() / over.sum()))
    out = {
        "max_ratio": torch.stack(ratio).mean(0).tolist(),
        "cls_on_outliers": sum(on_outliers) / len(seen),
        "cls_on_register": sum(register) / len(seen),
    }
    if masks is not None:
        out["cls_on_object"] = sum(on_object) / len(seen)
    return out


def test_time_register(
    model, images: list[Tensor], *, k: int, masks: list[Tensor] | None = None, seed: int = 0
) -> dict:
    """The finding on ``images`` (each ``(1, C, H, W)``, sizes may differ; ``masks``: per image the object's patches
    ``(rows, cols)``)."""
    a = anatomy(model)
    p = model.config.patch_size
    patches = [(x.shape[2] // p) * (x.shape[3] // p) for x in images]
    blocks = [j for j, b in enumerate(a.blocks) if b.mlp_out is not None and b.mlp_out.in_features > 0]
    if not blocks:
        raise ValueError(
            "no block of this model has feed-forward neurons to move onto a register (attention-only blocks, "
            "experts, or an output projection that is no single linear layer)"
        )
    before = [observe(model, x, acts_of=blocks) for x in images]
    ratios = torch.stack([patch_ratio(s, n) for s, n in zip(before, patches)]).mean(0)  # (blocks,)
    block = int(ratios.argmax())
    where = [outliers(s, block, n) for s, n in zip(before, patches)]
    upto = [j for j in blocks if j <= block]
    chosen = register_neurons(before, where, upto, k)
    rng = random.Random(seed)
    pool = [(j, n) for j in upto for n in range(before[0].acts[j].shape[-1])]
    rand: dict[int, list[int]] = {}
    for j, n in rng.sample(pool, min(k, len(pool))):
        rand.setdefault(j, []).append(n)
    conditions = {
        "bare extra token": {"register": True},
        "register, chosen neurons moved": {"register": True, "moved": chosen},
        "register, random neurons moved": {"register": True, "moved": rand},
    }
    runs = {"as it is": before} | {name: [observe(model, x, **kw) for x in images] for name, kw in conditions.items()}
    measured = {name: _shares(s, where, patches, masks) for name, s in runs.items()}
    out = _verdict(measured, block, float(ratios[block]), chosen, rand, k)
    out["outliers"] = where
    rows, cols = images[0].shape[2] // p, images[0].shape[3] // p  # the first image's [CLS] map, for the figure
    out["first_image_maps"] = {
        name: runs[name][0].cls[0, 1 : 1 + patches[0]].reshape(rows, cols).tolist()  # type: ignore[union-attr]
        for name in ("as it is", "register, chosen neurons moved")
    }
    return out


def _verdict(measured: dict, block: int, ratio: float, chosen: dict, rand: dict, k: int) -> dict:
    before, moved = measured["as it is"], measured["register, chosen neurons moved"]
    after = moved["max_ratio"][block]
    found = ratio > OUTLIER
    reproduced = found and after < OUTLIER and moved["cls_on_register"] > before["cls_on_outliers"] / 2
    obj = ""
    if "cls_on_object" in before:
        obj = f"; [CLS] attention on the object {before['cls_on_object']:.2f} -> {moved['cls_on_object']:.2f}"
    verdict = (
        f"{'high-norm patches' if found else 'no high-norm patch'}: the largest patch norm is {ratio:.1f}x the median "
        f"at block {block} (outliers from {OUTLIER:g}x); with a test-time register and {k} neurons moved onto it "
        f"{after:.1f}x, the register takes {moved['cls_on_register']:.2f} of the last layer's [CLS] attention, the "
        f"outlier patches {before['cls_on_outliers']:.2f} -> {moved['cls_on_outliers']:.2f}{obj}"
    )
    return {
        "block": block,
        "ratio": ratio,
        "neurons": {str(j): ns for j, ns in chosen.items()},
        "random_neurons": {str(j): ns for j, ns in rand.items()},
        "runs": measured,
        "verdict": verdict,
        "reproduced": bool(reproduced),
    }


__all__ = ["OUTLIER", "Seen", "observe", "outliers", "patch_ratio", "register_neurons", "test_time_register"]
