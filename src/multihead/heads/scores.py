"""Which heads matter: importance scores ``(layers, heads)`` for a classifier on labelled data (texts as token ids,
or images for a Vision Transformer: the same functions, the same head grid).

* ``michel`` -- Michel et al. 2019: ``I_h = sum_x |d loss(x) / d m_h|`` for a per-head mask ``m`` (all ones, or the
  current pruning mask), accumulated over the data, then L2-normalised within each layer.
* ``confidence`` -- Voita et al. 2019: the mean over real query tokens of the head's largest attention weight.
* ``entropy`` -- minus the mean attention entropy (focused heads score higher).
* ``loo`` -- leave one out, exact: the loss increase when the head alone is masked (one pass per head).

Higher = more important for all four. Already-masked heads (``mask == 0``) get ``nan``.

Scores and masks live on the *original* head grid ``(layers, H)``: on a physically pruned model (``prune_heads``)
the heads that are gone -- a whole layer, possibly -- score ``nan`` ("nothing"), and the others keep their original
numbers, so a score table reads the same before and after pruning.
"""

from __future__ import annotations

from .._io import atomic_write_json

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import length_sorted


def labelled_batches(data, labels, batch_size: int):
    """``(inputs, keep, y)`` batches of labelled examples: token ids (a list of lists; ``inputs = (ids, keep)``,
    ``keep`` the real tokens) or uint8 images ``(N, C, H, W)`` (``inputs = (images,)`` as floats, ``keep`` None: every
    patch is real). ``model(*inputs, head_mask=...)`` runs either."""
    if isinstance(data, Tensor):
        from ..data.images import to_float

        for i in range(0, len(data), batch_size):
            yield (to_float(data[i : i + batch_size]),), None, torch.as_tensor(labels[i : i + batch_size])
        return
    for chunk, x, keep in length_sorted(data, batch_size):
        yield (x, keep), keep, torch.tensor([labels[i] for i in chunk])


def _on(inputs: tuple, device) -> tuple:
    return tuple(t.to(device) for t in inputs)


def alive_heads(model: nn.Module) -> list[list[int]]:
    """Per layer, the original numbers of the heads still present (all of them before any physical pruning)."""
    out = []
    for layer in model.encoder.layers:
        attn = layer.attn
        total = attn.num_heads + len(attn.pruned_heads)
        out.append([h for h in range(total) if h not in attn.pruned_heads])
    return out


def head_shape(model: nn.Module) -> tuple[int, int]:
    """``(layers, H)`` of the original head grid (``H``: the most heads a layer had before pruning)."""
    layers = model.encoder.layers
    return len(layers), max((l.attn.num_heads + len(l.attn.pruned_heads) for l in layers), default=0)


def present(model: nn.Module) -> Tensor:
    """``(layers, H)`` float, 1 where a head exists, 0 where it was pruned away."""
    out = torch.zeros(head_shape(model))
    for l, hs in enumerate(alive_heads(model)):
        out[l, hs] = 1.0
    return out


def model_mask(model: nn.Module, grid: Tensor):
    """A ``(layers, H)`` grid mask as the model takes it: the grid itself before pruning, else one ``(H_l,)``
    tensor per layer holding the entries of the heads still present (differentiable either way)."""
    alive = alive_heads(model)
    if all(len(hs) == grid.shape[1] for hs in alive):
        return grid
    return [grid[l, torch.tensor(hs, dtype=torch.long)] for l, hs in enumerate(alive)]


def michel(model: nn.Module, ids, labels, mask: Tensor | None = None, batch_size: int = 32) -> Tensor:
    layers, heads = head_shape(model)
    mask = present(model) if mask is None else mask.clone().float() * present(model)
    device = next(model.parameters()).device
    head_mask = mask.to(device).requires_grad_(True)
    total = torch.zeros(layers, heads)
    model.eval()  # no dropout: the score is about the trained function
    for inputs, _, y in labelled_batches(ids, labels, batch_size):
        loss = F.cross_entropy(
            model(*_on(inputs, device), head_mask=model_mask(model, head_mask)), y.to(device), reduction="sum"
        )
        (grad,) = torch.autograd.grad(loss, head_mask)
        total += grad.detach().abs().cpu()
    total = total / total.norm(dim=1, keepdim=True).clamp_min(1e-12)  # L2 per layer (Michel et al. 2019)
    return total.masked_fill(mask == 0, float("nan"))  # masked and pruned-away heads score nothing


@torch.no_grad()
def attention_focus(
    model: nn.Module, ids, labels, mask: Tensor | None = None, batch_size: int = 32
) -> tuple[Tensor, Tensor]:
    """Mean max weight (confidence) and mean entropy per head, over real query tokens."""
    from ..modules.capture import capture

    layers, heads = head_shape(model)
    alive = alive_heads(model)
    device = next(model.parameters()).device
    conf, ent, rows = torch.zeros(layers, heads), torch.zeros(layers, heads), 0
    model.eval()
    for inputs, keep, _ in labelled_batches(ids, labels, batch_size):
        hm = None if mask is None else model_mask(model, mask.to(device))
        with capture(model) as cache:
            model(*_on(inputs, device), head_mask=hm)
        if keep is None:  # images: every query row is real
            p0 = cache.patterns()[0]
            keep = torch.ones(p0.shape[0], p0.shape[-2], dtype=torch.bool)
        real = keep[:, None, :, None].float()  # (B, 1, L, 1): real query rows
        for l, p in enumerate(cache.patterns()):  # (B, H_l, L, L); H_l = 0 for a layer pruned away
            if alive[l]:
                conf[l, alive[l]] += (p.amax(-1, keepdim=True) * real).sum((0, 2, 3))
                ent[l, alive[l]] += (-(p * p.clamp_min(1e-12).log()).sum(-1, keepdim=True) * real).sum((0, 2, 3))
        rows += int(keep.sum())
    gone = present(model) == 0
    return (conf / rows).masked_fill(gone, float("nan")), (ent / rows).masked_fill(gone, float("nan"))


def loss_with(model: nn.Module, ids, labels, mask: Tensor) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` with ``mask`` applied (the trainer's evaluation: token ids through
    :func:`~multihead.train.evaluation.evaluate_ids`, images through
    :func:`~multihead.train.vision.evaluate_images`)."""
    if isinstance(ids, Tensor):
        from ..train.vision import evaluate_images

        r = evaluate_images(model, ids, torch.as_tensor(labels), head_mask=model_mask(model, mask))
        return r["loss"], r["accuracy"]
    from ..train.evaluation import evaluate_ids

    r = evaluate_ids(
        model, ids, labels, model.fc.out_features, next(model.parameters()).device, head_mask=model_mask(model, mask)
    )
    return r["loss"], r["accuracy"]


def leave_one_out(model: nn.Module, ids, labels, mask: Tensor | None = None, progress: bool = False) -> Tensor:
    from tqdm import tqdm

    mask = present(model) if mask is None else mask.clone().float() * present(model)
    layers, heads = mask.shape
    base, _ = loss_with(model, ids, labels, mask)
    out = torch.full((layers, heads), float("nan"))
    alive = [(l, h) for l in range(layers) for h in range(heads) if mask[l, h] != 0]
    for l, h in tqdm(alive, disable=not progress, desc="leave one out"):
        m = mask.clone()
        m[l, h] = 0
        out[l, h] = loss_with(model, ids, labels, m)[0] - base
    return out


def importance(
    model: nn.Module, ids, labels, method: str = "michel", mask: Tensor | None = None, progress: bool = False
) -> Tensor:
    """``(layers, heads)`` scores by ``method`` (see the module docstring); higher = more important."""
    if method not in METHODS:
        raise ValueError(f"unknown importance method {method!r}; choose from {list(METHODS)}")
    return METHODS[method](model, ids, labels, mask, progress)


def _focus(which: str):
    def score(model, ids, labels, mask, progress=False) -> Tensor:
        conf, ent = attention_focus(model, ids, labels, mask)
        out = conf if which == "confidence" else -ent
        return out if mask is None else out.masked_fill(mask == 0, float("nan"))

    return score


# Importance methods by name (the CLI's --method choices come from here): fn(model, ids, labels, mask, progress).
METHODS = {
    "michel": lambda model, ids, labels, mask, progress=False: michel(model, ids, labels, mask),
    "confidence": _focus("confidence"),
    "entropy": _focus("entropy"),
    "loo": leave_one_out,
}


def format_table(scores, title: str = "") -> str:
    """A layers x heads table of ``scores`` (a tensor or nested lists; NaN: a pruned head, shown as -)."""
    scores = torch.as_tensor(scores, dtype=torch.float32)
    layers, heads = scores.shape
    lines = ([title] if title else []) + ["layer " + "".join(f"{'H' + str(h):>8}" for h in range(heads))]
    for l in range(layers):
        lines.append(f"{l:>5} " + "".join(f"{'-':>8}" if math.isnan(v) else f"{v:>8.3f}" for v in scores[l].tolist()))
    return "\n".join(lines)


def plot(scores: Tensor, stem, title: str) -> list:
    """The scores as a layers x heads grid (:func:`multihead.plotting.head_grid`)."""
    from ..plotting import head_grid

    return head_grid(scores, stem, title)


def labelled(run_path, data: str | None, splits: tuple[str, ...]):
    """A run (text classifier or ViT) and splits of its labelled examples, read once: ``(run, data name, {split:
    (examples, labels)}, "texts" | "images")``; text runs may be scored on other ``data``, image runs on their own."""

    from ..loading import task_of

    kind = task_of(run_path)
    if kind is not None and kind.section == "vision":
        from ..data.images import load_images
        from ..train.vision import load_vision_run

        run = load_vision_run(run_path)
        dc = run.config.data
        if data not in (None, dc.name):
            raise ValueError(f"{run_path} is an image run on {dc.name}; it is scored on its own data (drop --data)")
        bad = [s for s in splits if s not in ("train", "validation", "test")]
        if bad:
            raise ValueError(f"split must be train, validation or test for an image run, got {bad[0]!r}")
        images = load_images(dc.name, path=dc.path, seed=dc.split_seed)
        return run, dc.name, {s: getattr(images, s) for s in splits}, "images"
    from ..train import load_run
    from ..train.inference import examples

    run = load_run(run_path)
    name, parts = examples(run, data, splits=splits)
    return run, name, {s: parts[s][:2] for s in splits}, "texts"


def score_run(
    run_path,
    method: str = "michel",
    *,
    data: str | None = None,
    split: str = "validation",
    n: int | None = None,
    out=None,
    progress: bool = True,
) -> dict:
    """Score a run folder's heads on ``split`` of ``data``; writes ``importance-<method>.json`` and a heatmap to
    ``out`` (default ``RUN/importance``)."""
    from pathlib import Path

    from .._io import check_target, folder_lock

    out = Path(out) if out else Path(run_path) / "importance"
    check_target(out, "importance", sources=(run_path,))  # before the (slow) scoring
    run, name, parts, what = labelled(run_path, data, (split,))
    ids, labels = parts[split]
    if n:
        ids, labels = ids[:n], labels[:n]
    scores = importance(run.model, ids, labels, method, progress=progress)
    title = f"{run_path}: {method} head importance on {name} [{split}], {len(ids)} {what}"
    payload = {
        "run": str(run_path),
        "method": method,
        "data": name,
        "split": split,
        "n": len(ids),
        "scores": [[None if v != v else round(v, 6) for v in row] for row in scores.tolist()],
    }
    with folder_lock(out):  # other methods' files in the folder are kept; each file is replaced atomically
        atomic_write_json(out / f"importance-{method}.json", payload)
        files = plot(scores, out / f"importance-{method}", title)
    return {**payload, "tensor": scores, "title": title, "json": out / f"importance-{method}.json", "files": files}


__all__ = [
    "METHODS",
    "attention_focus",
    "labelled",
    "labelled_batches",
    "format_table",
    "importance",
    "leave_one_out",
    "loss_with",
    "michel",
    "plot",
    "score_run",
]
