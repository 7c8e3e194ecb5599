"""Attention on pictures: what every head of a :class:`~multihead.models.vision.VisionTransformer` looks at.

``multihead show runs/vit --index 17`` (a test image) or ``--image x.png`` writes, over the image:

* ``cls_grid`` -- layers x heads: the [CLS] query's attention over the patches as a heat map on the image (with mean
  pooling, the average patch query's attention);
* ``rollout`` -- attention rollout (Abnar & Zuidema 2020: ``0.5 I + 0.5 mean_heads(W)`` per layer, multiplied
  upwards), the [CLS] row over the patches;
* ``patch_grid`` -- layers x heads: where one chosen patch (``--patch ROW,COL``, default the centre) looks;
* ``distance`` -- mean attention distance per head against depth (Dosovitskiy et al. 2021, Fig. 7), over many test
  images (:func:`attention_distance`).

Every figure is PNG and SVG; ``image.json`` records the prediction and the numbers drawn.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch import Tensor

from ...modules.capture import attention_modules, capture
from ...plotting import pyplot, save


@torch.no_grad()
def image_patterns(model, image: Tensor) -> tuple[list[Tensor], Tensor | None]:
    """Per-layer weights ``(H, T, T)`` for one float image ``(1, C, H, W)``, and the class probabilities (None for
    a backbone without a classifier, e.g. DINOv2)."""
    model.eval()
    with capture(model, ("pattern",)) as cache:
        out = model(image)
    probs = torch.softmax(out.float(), -1)[0] if model.fc is not None else None
    return [p[0] for p in cache.patterns()], probs


def _query_over_patches(w: Tensor, model, query: int | None) -> Tensor:
    """``(H, T, T)`` -> ``(H, grid, grid)``: the ``query`` row over the patch keys (renormalised over patches);
    ``query=None`` averages every patch query (models without [CLS])."""
    o = model.config.patch_offset
    g = math.isqrt(w.shape[-1] - o)  # square images: the grid of this input (any size for interpolated positions)
    rows = w[:, o:, o:].mean(1) if query is None else w[:, query, o:]  # (H, N)
    rows = rows / rows.sum(-1, keepdim=True).clamp_min(1e-30)
    return rows.reshape(-1, g, g)


def rollout_patches(patterns: list[Tensor], model, residual: float = 0.5) -> Tensor:
    """Attention rollout of the [CLS] token (or the mean patch query) over the patches: ``(grid, grid)``."""
    t = patterns[0].shape[-1]
    eye = torch.eye(t)
    out = eye.clone()
    for w in patterns:
        a = residual * eye + (1 - residual) * (w.mean(0) if w.shape[0] else torch.zeros(t, t))
        out = (a / a.sum(-1, keepdim=True)) @ out
    cls = None if model.config.patch_offset == 0 else 0
    return _query_over_patches(out[None], model, cls)[0]


def _overlay(ax, image: Tensor, heat: Tensor, size: int, *, mark: tuple[int, int] | None = None, p: int = 1) -> None:
    """The grey image with ``heat`` ``(grid, grid)`` upsampled (nearest) over it, scaled to the map's largest value:
    the colour says how strong, and the opacity grows with it, so weak patches leave the picture readable instead of
    tinting it."""
    up = heat.repeat_interleave(p, 0).repeat_interleave(p, 1).float()
    norm = (up / (float(up.max()) or 1.0)).clamp(0, 1).numpy()
    rgba = pyplot().get_cmap(HEAT)(norm)
    rgba[..., 3] = 0.1 + 0.8 * norm
    ax.imshow(image.numpy(), cmap="gray", vmin=0, vmax=255, extent=(0, size, size, 0))
    ax.imshow(rgba, extent=(0, size, size, 0))
    if mark is not None:
        r, c = mark
        ax.add_patch(pyplot().Rectangle((c * p, r * p), p, p, fill=False, edgecolor="cyan", linewidth=1.5))
    ax.set_xticks([])
    ax.set_yticks([])


def _grid_figure(
    maps: list[Tensor], image: Tensor, model, title: str, stem: Path, *, mark: tuple[int, int] | None = None
) -> list[Path]:
    plt = pyplot()
    rows, cols = len(maps), max([m.shape[0] for m in maps] + [1])
    size, p = image.shape[-1], model.config.patch_size
    fig, axes = plt.subplots(
        rows, cols, figsize=(1.6 * cols + 0.9, 1.6 * rows + 0.9), squeeze=False, layout="constrained"
    )  # constrained: the title, the row labels and the colorbar each get their own room
    for l, m in enumerate(maps):
        for h in range(cols):
            ax = axes[l][h]
            if h < m.shape[0]:
                _overlay(ax, image, m[h], size, mark=mark, p=p)
            else:
                ax.axis("off")
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    _heat_colorbar(fig, axes)
    files = save(fig, stem)
    plt.close(fig)
    return files


HEAT = "inferno"


def _heat_colorbar(fig, axes) -> None:
    """One colorbar for maps drawn by :func:`_overlay` (each scaled to its own largest value)."""
    import matplotlib as mpl

    bar = fig.colorbar(
        mpl.cm.ScalarMappable(norm=mpl.colors.Normalize(0, 1), cmap=HEAT), ax=axes, fraction=0.02, pad=0.01
    )
    bar.set_label("weight / the map's largest", fontsize=8)


def show_image(
    model,
    image_u8: Tensor,
    labels: list[str] | None,
    out: Path,
    *,
    truth: str | None = None,
    patch: tuple[int, int] | None = None,
    name: str = "image",
    inputs: Tensor | None = None,
    model_name: str = "ViT",
    note: str | None = None,
) -> dict:
    """Write the pictures for one square uint8 image ``(1, C, S, S)`` into ``out`` (created); returns the
    summary. ``inputs``: the model's float input when it is not ``to_float(image_u8)`` (e.g. DINOv2's ImageNet
    normalisation); ``labels`` None for a backbone (no prediction); ``model_name`` titles the page; ``note`` is
    printed under the rollout (what a reader should know about this model's maps)."""
    from ..._io import atomic_write_json
    from ...data.images import to_float

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    g = image_u8.shape[-1] // cfg.patch_size
    patch = (g // 2, g // 2) if patch is None else patch
    if not (0 <= patch[0] < g and 0 <= patch[1] < g):
        raise ValueError(
            f"--patch {patch[0]},{patch[1]} is outside the {g}x{g} patch grid (rows and columns 0..{g - 1})"
        )
    patterns, probs = image_patterns(model, to_float(image_u8) if inputs is None else inputs)
    grey = image_u8[0].float().mean(0)  # (H, W)
    pred = labels[int(probs.argmax())] if probs is not None and labels else None
    cls = 0 if cfg.patch_offset else None
    what = "[CLS]" if cls == 0 else "mean patch query"
    said = "" if pred is None else f" (predicted {pred}{'' if truth is None else f', true {truth}'})"
    files = _grid_figure(
        [_query_over_patches(w, model, cls) for w in patterns],
        grey,
        model,
        f"{name}: {what} attention per head{said}",
        out / "cls_grid",
    )
    q = cfg.patch_offset + patch[0] * g + patch[1]
    files += _grid_figure(
        [_query_over_patches(w, model, q) for w in patterns],
        grey,
        model,
        f"{name}: where patch (row {patch[0]}, column {patch[1]}) looks, per head",
        out / "patch_grid",
        mark=patch,
    )
    roll = rollout_patches(patterns, model)
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3.2))
    a.imshow(grey.numpy(), cmap="gray", vmin=0, vmax=255)
    a.set_title(f"{name}{said}", fontsize=9)
    a.set_xticks([])
    a.set_yticks([])
    _overlay(b, grey, roll, grey.shape[-1], p=cfg.patch_size)
    b.set_title("attention rollout of " + what, fontsize=9)
    fig.tight_layout(rect=(0, 0.12 if note else 0, 1, 1))
    if note:
        fig.text(0.02, 0.01, note, fontsize=6.5, wrap=True, va="bottom")
    _heat_colorbar(fig, [a, b])
    files += save(fig, out / "rollout")
    plt.close(fig)
    files.append(image_page(model, patterns, image_u8[0], out / "attention.html", f"{name}{said}", model_name))
    summary = {
        "image": name,
        "predicted": pred,
        "true": truth,
        "probabilities": {} if probs is None else {lab: round(float(v), 5) for lab, v in zip(labels, probs)},
        "patch": list(patch),
        "rollout": roll.tolist(),
        "files": [str(f.relative_to(out)) for f in files],
        "seconds": time.perf_counter() - t0,
    }
    atomic_write_json(out / "image.json", summary)
    return summary


def image_page(model, patterns: list[Tensor], image_u8: Tensor, path: Path, text: str, model_name: str = "ViT") -> Path:
    """The offline page (:mod:`multihead.interpret.pages.page`) of a ViT's self-attention on one image ``(C, H, W)``,
    with the image view: hover a patch, see where every head looks from it. It opens on the last layer, on the head
    whose [CLS] query (or first patch) is most focused."""
    from ..maps import AttentionMaps
    from ..pages.page import page_image, write_page

    cfg = model.config
    g, o = image_u8.shape[-1] // cfg.patch_size, cfg.patch_offset
    tokens = ["[CLS]"] * o + [f"patch {r},{c}" for r in range(g) for c in range(g)]
    maps = AttentionMaps(text, tokens, [p.float() for p in patterns], model_name)
    last = maps.layers[-1]  # (H, N, N)
    start = (len(maps.layers) - 1, int(last[:, 0, o:].max(-1).values.argmax()))
    return write_page(
        maps,
        path,
        image=page_image(image_u8, patch=cfg.patch_size, queries="patches", query_offset=o, key_offset=o),
        start=start,
    )


@torch.no_grad()
def show_grounding(
    model, canvas_u8: Tensor, question: Tensor, vocab, out: Path, *, truth: str | None = None, name: str = "canvas"
) -> dict:
    """A :class:`~multihead.models.grounding.GroundedQA`'s view of one canvas ``(1, C, H, W)`` uint8 and question
    ``(1, T)``: ``cross_grid`` (layers x heads: the question's cross-attention over the canvas, mean over its words)
    and ``words`` (each word's attention, mean over the last layer's heads). Returns the summary."""
    from ...data.images import to_float
    from ...models.grounding import quadrant_of_patches

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    vit = model.vision
    g = vit.config.grid
    layers = [i for i, (n, _) in enumerate(attention_modules(model)) if ".cross_attn" in n]
    with capture(model, ("pattern",), layers=layers) as cache:
        probs = torch.softmax(model(to_float(canvas_u8), question).float(), -1)[0]
    patterns = [cache.pattern(i)[0] for i in layers]  # each (H, T, N)
    real = question[0] != 0
    words = [vocab.words[int(t)] for t in question[0][real]]
    maps = [p[:, real].mean(1).reshape(-1, g, g) for p in patterns]  # (H, g, g) per layer
    grey = canvas_u8[0].float().mean(0)
    answer = vocab.answers[int(probs.argmax())]
    text = " ".join(words)
    files = _grid_figure(
        maps,
        grey,
        vit,
        f'{name}: "{text}" -> {answer}{"" if truth is None else f" (true {truth})"}'
        " -- cross-attention of the question per head",
        out / "cross_grid",
    )
    last = patterns[-1][:, real].mean(0)  # (T, N), mean over the last layer's heads
    files += _grid_figure(
        [last.reshape(-1, g, g)], grey, vit, "each word's attention (last layer, mean of heads)", out / "words"
    )
    from ..maps import AttentionMaps
    from ..pages.page import page_image, write_page

    keys = [f"patch {r},{c}" for r in range(g) for c in range(g)]
    maps = AttentionMaps(
        f"{text} -> {answer}", words, [p[:, real].float() for p in patterns], "question -> canvas", key_tokens=keys
    )
    files.append(
        write_page(
            maps, out / "attention.html", image=page_image(canvas_u8[0], patch=vit.config.patch_size, queries="tokens")
        )
    )
    quad = quadrant_of_patches(vit.config)
    share = [
        [[float(p[h, real][:, quad == q].sum(-1).mean()) for q in range(4)] for h in range(p.shape[0])]
        for p in patterns
    ]
    summary = {
        "canvas": name,
        "question": text + "",
        "answer": answer,
        "probability": float(probs.max()),
        "true": truth,
        "words": words,
        "share_by_quadrant": share,  # [layer][head][quadrant]: the question's mass on each quadrant
        "files": [str(f.relative_to(out)) for f in files],
        "seconds": time.perf_counter() - t0,
    }
    return summary


@torch.no_grad()
def attention_distance_grid(model, images_u8: Tensor) -> Tensor:
    """:func:`attention_distance` as one ``(layers, H)`` tensor."""
    return torch.stack(attention_distance(model, images_u8))


def attention_distance(model, images_u8: Tensor, *, batch_size: int = 256) -> list[Tensor]:
    """Mean attention distance in pixels per layer ``(H,)``, averaged over ``images_u8`` ``(N, C, H, W)``."""
    from ...data.images import to_float
    from ...models.vision import mean_attention_distance

    model.eval()
    total, n = None, 0
    for i in range(0, len(images_u8), batch_size):
        chunk = images_u8[i : i + batch_size]
        with capture(model, ("pattern",)) as cache:
            model(to_float(chunk))
        d = mean_attention_distance(cache.patterns(), model)
        total = [x * len(chunk) for x in d] if total is None else [t + x * len(chunk) for t, x in zip(total, d)]
        n += len(chunk)
    return [t / max(n, 1) for t in total or []]


def plot_distance(distances: list[Tensor], model, stem: Path, title: str = "") -> list[Path]:
    """Each head's mean attention distance (dots) and the layer mean (line) against depth, with the largest possible
    distance for reference (as Dosovitskiy et al.'s Fig. 7)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for l, d in enumerate(distances):
        ax.scatter([l] * len(d), d.tolist(), s=18, color="tab:blue", alpha=0.8, label="a head" if l == 0 else None)
    ax.plot(
        range(len(distances)),
        [float(d.mean()) if len(d) else math.nan for d in distances],
        "k--",
        lw=1,
        label="layer mean",
    )
    ax.set_xlabel("layer (depth)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(range(len(distances)))
    ax.set_ylim(0, model.config.image_size * 0.75)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "mean attention distance per head", fontsize=9)
    fig.tight_layout()
    files = save(fig, stem)
    plt.close(fig)
    return files


__all__ = [
    "attention_distance",
    "image_page",
    "image_patterns",
    "plot_distance",
    "rollout_patches",
    "show_grounding",
    "show_image",
]
