"""What a pretrained ViT's heads do on real photographs (DINOv2-small, :mod:`multihead.dinov2`), three findings of
the literature measured with the rules stated here:

* **[CLS] attention segments objects without labels** (Caron et al. 2021, Fig. 1 and 3): the last layer's [CLS]
  query over the patches, per head. Measured against a hand-drawn box around the object of each photograph
  (:data:`PHOTOS`, in the photograph's own pixels, stated below): the share of the head's [CLS] attention that
  falls on patches whose centre is inside the box, against the box's share of the patches (what a uniform head
  would score), and the Jaccard index between the box and the patches that hold the top 60% of the attention mass
  (the paper's thresholding).
* **Attention distance grows with depth** (Dosovitskiy et al. 2021, Fig. 7): per head, the pixel distance between a
  patch query and the patches it attends to, weighted by the attention (at the model's input resolution).
* **High-norm artifact tokens** (Darcet et al. 2024, "Vision Transformers Need Registers"): patch tokens whose
  residual-stream norm after a layer is far above the rest (here: more than ``outlier`` times the median token norm of
  that image and layer), where they sit, and how much of the last layer's [CLS] attention they take.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...modules.capture import capture

# object boxes (top, left, bottom, right) in the original photograph's pixels, drawn by hand
PHOTOS = {
    "chelsea": {"object": "the cat", "box": (0, 0, 300, 395)},  # 300 x 451: all of the cat, the room on the right
    "astronaut": {"object": "the astronaut", "box": (15, 20, 512, 365)},  # 512 x 512: her, not the flag or shuttle
    "coffee": {"object": "the cup and saucer", "box": (15, 75, 390, 480)},  # 400 x 600: not the table
    "rocket": {"object": "the rocket", "box": (125, 300, 410, 345)},  # 427 x 640: the rocket, not the towers
}
MASS = 0.6  # Caron et al. keep the patches that hold this share of the attention
OUTLIER = 4.0  # a token is high-norm when its norm is more than this many times the median of its image and layer


def photo(name: str):
    """One of scikit-image's sample photographs (shipped in its wheel; no download) as an ``(H, W, 3)`` uint8
    array."""
    if name not in PHOTOS:
        raise ValueError(f"unknown photograph {name!r}; choose from {sorted(PHOTOS)}")
    try:
        import skimage.data
    except ImportError:
        raise ValueError(
            "the sample photographs come from scikit-image, which is not installed: pip install scikit-image"
        ) from None
    return getattr(skimage.data, name)()


def photo_input(d, name: str, *, size: int = 224) -> tuple:
    """One of :data:`PHOTOS` ready for the model ``d`` (a loaded DINOv2): the photograph ``(H, W, 3)``, its input
    ``(1, 3, H', W')`` and its object's patches ``(rows, cols)`` (bool)."""
    image = photo(name)
    x = d.preprocess(image, size=size)
    p = d.model.config.patch_size
    return image, x, box_mask(PHOTOS[name]["box"], image.shape[:2], (x.shape[2] // p, x.shape[3] // p))


@torch.no_grad()
def run(model, x: Tensor) -> dict:
    """Patterns ``(H, T, T)`` per layer, residual stream ``(T, E)`` after each layer, of one image ``(1, 3, H, W)``."""
    with capture(model, ("pattern", "resid")) as cache:
        model.features(x)
    p = model.config.patch_size
    return {
        "patterns": [w[0] for w in cache.patterns()],
        "resid": [cache.get_layer("resid", i)[0] for i in range(len(cache.attention_modules))],
        "grid": (x.shape[2] // p, x.shape[3] // p),
    }


def cls_maps(patterns: list[Tensor], grid: tuple[int, int], offset: int = 1) -> list[Tensor]:
    """Per layer ``(H, rows, cols)``: the [CLS] query's attention over the patches, renormalised over them."""
    out = []
    for w in patterns:
        row = w[:, 0, offset:]
        out.append((row / row.sum(-1, keepdim=True).clamp_min(1e-30)).reshape(-1, *grid))
    return out


def box_mask(box: tuple[int, int, int, int], image_hw: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """``(rows, cols)`` bool: patches whose centre falls inside ``box`` (original pixels)."""
    top, left, bottom, right = box
    h, w = image_hw
    rows, cols = grid
    cy = (torch.arange(rows, dtype=torch.float64) + 0.5) * h / rows
    cx = (torch.arange(cols, dtype=torch.float64) + 0.5) * w / cols
    return ((cy >= top) & (cy < bottom))[:, None] & ((cx >= left) & (cx < right))[None, :]


def top_mass(heat: Tensor, mass: float = MASS) -> Tensor:
    """The smallest set of cells holding ``mass`` of ``heat`` (largest first), as a bool map of its shape."""
    flat = heat.flatten()
    order = flat.argsort(descending=True)
    keep = (flat[order].cumsum(0) - flat[order]) < mass * flat.sum()  # a cell is kept while the mass before it is short
    out = torch.zeros_like(flat, dtype=torch.bool)
    out[order[keep]] = True
    return out.view(heat.shape)


def object_scores(heat: Tensor, mask: Tensor) -> dict:
    """Per head: the attention share inside ``mask``, and the Jaccard index of the top-60%-mass patches and it."""
    share, jaccard = [], []
    for h in heat:
        share.append(float(h[mask].sum() / h.sum()))
        kept = top_mass(h)
        jaccard.append(float((kept & mask).sum() / (kept | mask).sum()))
    return {"share": share, "jaccard": jaccard, "area": float(mask.float().mean())}


def high_norm_tokens(resid: list[Tensor], outlier: float = OUTLIER, offset: int = 1) -> list[dict]:
    """Per layer: the patch tokens whose norm exceeds ``outlier`` times the median patch norm (their indices among
    the patches), and the largest ratio to the median."""
    out = []
    for x in resid:
        norms = x[offset:].norm(dim=-1)
        med = float(norms.median())
        idx = (norms > outlier * med).nonzero().flatten().tolist()
        out.append(
            {
                "median": med,
                "max_ratio": float(norms.max() / med),
                "tokens": idx,
                "norms": [round(float(v), 3) for v in norms],
            }
        )
    return out


@torch.no_grad()
def study(d, names=("chelsea", "astronaut", "coffee", "rocket"), *, size: int = 224) -> dict:
    """The three findings on the photographs ``names`` (see the module docstring) at ``size`` pixels on the
    shorter side. Returns per photograph the object scores per head of the last layer, the attention distances, the
    high-norm tokens per layer and the share of the last layer's [CLS] attention on them; and the means."""
    from ...models.vision import mean_attention_distance

    model = d.model.eval()
    photos, distances = {}, []
    for name in names:
        image, x, mask = photo_input(d, name, size=size)
        r = run(model, x)
        maps = cls_maps(r["patterns"], r["grid"])
        last = maps[-1]
        scores = object_scores(last, mask)
        dist = mean_attention_distance([w[None] for w in r["patterns"]], model, grid=r["grid"])
        distances.append(torch.stack(dist))
        norms = high_norm_tokens(r["resid"])
        hi = norms[-1]["tokens"]
        cls_mean = last.mean(0).flatten()
        photos[name] = {
            "object": PHOTOS[name]["object"],
            "box": PHOTOS[name]["box"],
            "image_hw": list(image.shape[:2]),
            "input_hw": list(x.shape[2:]),
            "grid": list(r["grid"]),
            **scores,
            "cls_last": [m.tolist() for m in last],
            "norms": norms,
            "high_norm_cls_share": float(cls_mean[hi].sum()) if hi else 0.0,
            "high_norm_patch_share": len(hi) / cls_mean.numel(),
        }
    dist = torch.stack(distances).mean(0)  # (layers, H)
    shares = torch.tensor([photos[n]["share"] for n in names])  # (photos, H)
    areas = torch.tensor([photos[n]["area"] for n in names])
    return {
        "size": size,
        "photos": photos,
        "distance": dist.tolist(),
        "rule": {
            "object": f"share of the last layer's [CLS] attention on patches whose centre is in the box; "
            f"Jaccard of the patches holding the top {MASS:.0%} of it and the box",
            "distance": "attention-weighted pixel distance from each patch query to the patches, at the "
            "model's input resolution, mean over queries and photographs",
            "high_norm": f"patch tokens whose norm after a layer exceeds {OUTLIER} x the median of that "
            "image and layer",
        },
        "mean": {
            "share_best_head": float(shares.max(1).values.mean()),
            "share_mean_head": float(shares.mean()),
            "area": float(areas.mean()),
            "jaccard_best_head": float(torch.tensor([max(photos[n]["jaccard"]) for n in names]).mean()),
        },
    }


def format_study(r: dict) -> str:
    lines = [
        f"[CLS] attention of the last layer on the object (input {r['size']} px on the shorter side):",
        f"{'photograph':<11}{'object':<20}{'box area':>9}{'best head':>11}{'mean head':>11}{'Jaccard':>9}",
    ]
    for name, p in r["photos"].items():
        best = max(range(len(p["share"])), key=lambda h: p["share"][h])
        lines.append(
            f"{name:<11}{p['object']:<20}{p['area']:>9.2f}{p['share'][best]:>8.2f} h{best}"
            f"{sum(p['share']) / len(p['share']):>11.2f}{max(p['jaccard']):>9.2f}"
        )
    dist = torch.tensor(r["distance"])
    lines.append("mean attention distance (pixels) per layer: " + " ".join(f"{float(v):.0f}" for v in dist.mean(1)))
    lines.append(
        "  head range in the first / last layer: "
        f"{float(dist[0].min()):.0f}-{float(dist[0].max()):.0f} / {float(dist[-1].min()):.0f}-"
        f"{float(dist[-1].max()):.0f}"
    )
    for name, p in r["photos"].items():
        worst = max(range(len(p["norms"])), key=lambda i: p["norms"][i]["max_ratio"])
        lines.append(
            f"high-norm tokens in {name}: largest norm / median {p['norms'][worst]['max_ratio']:.1f} "
            f"(layer {worst}); in the last layer {len(p['norms'][-1]['tokens'])} tokens "
            f"({p['high_norm_patch_share']:.1%} of the patches) take {p['high_norm_cls_share']:.1%} of "
            "the [CLS] attention"
        )
    return "\n".join(lines)


def plot_objects(r: dict, stem, title: str) -> list:
    """Per photograph (rows): the photograph with its box, then each head's last-layer [CLS] attention over it, with
    the head's share on the object; one colorbar per row (attention per patch)."""
    import numpy as np

    from ...plotting import plain, pyplot, save

    plt = pyplot()
    names = list(r["photos"])
    heads = len(r["photos"][names[0]]["share"])
    fig, axes = plt.subplots(
        len(names), heads + 1, figsize=(2.1 * (heads + 1) + 0.8, 1.9 * len(names) + 0.6), squeeze=False
    )
    for row, name in zip(axes, names):
        p = r["photos"][name]
        image = photo(name)
        h, w = p["image_hw"]
        top, left, bottom, right = p["box"]
        row[0].imshow(image)
        row[0].add_patch(plt.Rectangle((left, top), right - left, bottom - top, fill=False, edgecolor="cyan", lw=1.5))
        row[0].set_title(plain(f"{name}: {p['object']}"), fontsize=8)
        grey = image.mean(-1)
        vmax = max(float(np.max(m)) for m in p["cls_last"])
        for hd in range(heads):
            ax = row[hd + 1]
            ax.imshow(grey, cmap="gray", extent=(0, w, h, 0))
            im = ax.imshow(
                np.array(p["cls_last"][hd]), cmap="inferno", alpha=0.7, extent=(0, w, h, 0), vmin=0, vmax=vmax
            )
            ax.add_patch(plt.Rectangle((left, top), right - left, bottom - top, fill=False, edgecolor="cyan", lw=0.8))
            ax.set_title(f"head {hd}: {p['share'][hd]:.0%} in a box of {p['area']:.0%}", fontsize=8)
        bar = fig.colorbar(im, ax=list(row), fraction=0.015, pad=0.01)
        bar.set_label("weight", fontsize=7)
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(
        plain(
            title + " (colour: the [CLS] query's weight per patch; box: the object; a head beats uniform attention "
            "when its share in the box exceeds the box's share of the picture)"
        ),
        fontsize=10,
    )
    return save(fig, stem)


def plot_norms(r: dict, stem, title: str) -> list:
    """Left: each layer's largest token norm over the median (every photograph), the outlier threshold dashed.
    Right: the last layer's token norms over one photograph, high-norm tokens marked."""
    import numpy as np

    from ...plotting import plain, pyplot, save

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, p in r["photos"].items():
        a.plot([n["max_ratio"] for n in p["norms"]], marker="o", ms=3, label=name)
    a.axhline(OUTLIER, color="k", ls="--", lw=1, label=f"threshold ({OUTLIER:g} x median)")
    a.set_xlabel("layer")
    a.set_ylabel("largest patch-token norm / median")
    a.set_yscale("log")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    a.set_title("outlier tokens per layer", fontsize=9)
    name = max(r["photos"], key=lambda n: r["photos"][n]["norms"][-1]["max_ratio"])
    p = r["photos"][name]
    rows, cols = p["grid"]
    norms = np.array(p["norms"][-1]["norms"]).reshape(rows, cols)
    h, w = p["image_hw"]
    b.imshow(photo(name).mean(-1), cmap="gray", extent=(0, w, h, 0))
    im = b.imshow(norms, cmap="viridis", alpha=0.75, extent=(0, w, h, 0))
    for t in p["norms"][-1]["tokens"]:
        rr, cc = divmod(t, cols)
        b.add_patch(plt.Rectangle((cc * w / cols, rr * h / rows), w / cols, h / rows, fill=False, edgecolor="red"))
    fig.colorbar(im, ax=b, label="token norm after the last layer")
    b.set_xticks([])
    b.set_yticks([])
    b.set_title(plain(f"{name}: last layer, high-norm tokens in red"), fontsize=9)
    fig.suptitle(plain(title), fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def plot_distances(distances: dict, stem, title: str) -> list:
    """Mean attention distance per head against depth for each model (name -> ``(layers, H)`` in pixels), each
    model's distances as a share of its input's size on the right axis label."""
    from ...plotting import plain, pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, len(distances), figsize=(5.2 * len(distances), 3.8), squeeze=False)
    for ax, (name, (dist, size)) in zip(axes[0], distances.items()):
        dist = torch.as_tensor(dist)
        for l in range(dist.shape[0]):
            ax.scatter(
                [l] * dist.shape[1],
                dist[l].tolist(),
                s=16,
                color="tab:blue",
                alpha=0.8,
                label="a head" if l == 0 else None,
            )
        ax.plot(range(dist.shape[0]), dist.mean(1).tolist(), "k--", lw=1, label="layer mean")
        ax.set_xlabel("layer (depth)")
        ax.set_ylabel("mean attention distance (pixels)")
        ax.set_xticks(range(dist.shape[0]))
        ax.set_ylim(0, size * 0.75)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(plain(f"{name} ({size} px input)"), fontsize=9)
    fig.suptitle(plain(title), fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


__all__ = [
    "MASS",
    "OUTLIER",
    "PHOTOS",
    "box_mask",
    "cls_maps",
    "format_study",
    "high_norm_tokens",
    "object_scores",
    "photo",
    "plot_distances",
    "plot_norms",
    "plot_objects",
    "run",
    "study",
    "top_mass",
]
