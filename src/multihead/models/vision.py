"""A Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words") on our encoder blocks.

Images ``(B, C, H, W)`` -> patches -> tokens ``(B, N, E)`` (+ a [CLS] token) -> :class:`TransformerEncoder` ->
pooled -> class logits. The blocks are the text models' :class:`~multihead.EncoderBlock` s, so hooks and
``capture``, ``head_mask``, ``prune_heads``, the attention backends and the pictures work unchanged.

Patch embedding (``stem``):

* ``patch`` -- the paper's: a ``patch x patch`` convolution with stride ``patch`` (a linear map of each flattened
  patch), ``N = (H / patch) * (W / patch)`` tokens.
* ``conv`` -- a hybrid (the paper's section 3.1 hybrids; Hassani et al. 2021, "Escaping the Big Data Paradigm with
  Compact Transformers"): two 3x3 convolutions with GELU at full resolution before the same patch projection, so
  each token starts from local features rather than raw pixels. The token count is the same as ``patch``: the
  transformer's cost is unchanged, and small data learns much faster.

Positions are learned (the paper) or fixed 2-D sine-cosine (MoCo v3, MAE); pooling is the [CLS] token (the paper)
or the mean of the patch tokens. Token 0 is [CLS] when ``pooling="cls"``; patch ``(r, c)`` is token
``1 + r * grid + c`` then (``patch_offset``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from .._config import check_size, from_fields
from ..modules.encoder import EncoderConfig, TransformerEncoder
from ..modules.hooks import HookPoint

STEMS = ("patch", "conv")
VISION_POOLINGS = ("cls", "mean")
VISION_POSITIONALS = ("learned", "sincos")


def _default_encoder() -> EncoderConfig:
    return EncoderConfig(
        d_model=128, num_heads=4, num_layers=4, d_ff=256, dropout=0.0, activation="gelu", norm_first=True
    )


@dataclass
class VisionConfig:
    """Everything that defines a :class:`VisionTransformer`; round-trips through JSON."""

    image_size: int = 28  # square images of image_size x image_size pixels
    channels: int = 1
    patch_size: int = 4
    stem: str = "patch"  # patch | conv (hybrid: two 3x3 convolutions before the patch projection)
    stem_channels: int = 32  # conv stem width
    pooling: str = "cls"  # cls | mean (over patch tokens)
    positional: str = "learned"  # learned | sincos (fixed 2-D)
    num_classes: int = 10  # 0: no classifier head; forward returns the pooled features (a backbone, as timm's)
    # learned positions stored for a grid of this many patches per side and interpolated (bicubic, as DINOv2 and
    # timm) to each input's grid, so any image whose sides are multiples of patch_size runs; None: the positions
    # of image_size only
    position_grid: int | None = None
    encoder: EncoderConfig = field(default_factory=_default_encoder)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        from .._config import check_rules

        check_rules(
            [
                ("stem", self.stem in STEMS, f"one of {', '.join(STEMS)}"),
                ("pooling", self.pooling in VISION_POOLINGS, f"one of {', '.join(VISION_POOLINGS)}"),
                ("positional", self.positional in VISION_POSITIONALS, f"one of {', '.join(VISION_POSITIONALS)}"),
                ("image_size", 1 <= self.image_size <= 4096, "in [1, 4096]"),
                ("channels", 1 <= self.channels <= 64, "in [1, 64]"),
                ("patch_size", 1 <= self.patch_size <= self.image_size, "in [1, image_size]"),
                ("stem_channels", 1 <= self.stem_channels <= 4096, "in [1, 4096]"),
                ("num_classes", self.num_classes == 0 or self.num_classes >= 2, "0 (a backbone) or >= 2"),
                (
                    "position_grid",
                    self.position_grid is None or 1 <= self.position_grid <= 1024,
                    "None or in [1, 1024]",
                ),
            ]
        )
        if self.position_grid is not None and self.positional != "learned":
            raise ValueError(
                "position_grid interpolates a learned position table; sine-cosine positions are computed "
                "for any grid: drop position_grid or set positional='learned'"
            )
        if self.image_size % self.patch_size:
            fits = [p for p in range(1, self.image_size + 1) if self.image_size % p == 0]
            raise ValueError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}: the "
                f"patches would not tile the image; choose patch_size from {fits}"
            )
        if self.positional == "sincos" and self.encoder.d_model % 4:
            raise ValueError(
                f"2-D sine-cosine positions split d_model into 4 parts; d_model={self.encoder.d_model} "
                "is not a multiple of 4"
            )
        if self.encoder.rotary:
            raise ValueError(
                "rotary positions are 1-D; a ViT uses learned or 2-D sine-cosine positions "
                "(positional='learned' or 'sincos')"
            )

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2

    @property
    def patch_offset(self) -> int:
        """Index of the first patch token (1 after [CLS])."""
        return 1 if self.pooling == "cls" else 0

    def parameter_estimate(self) -> int:
        e, enc = self.encoder.d_model, self.encoder
        d_ff = enc.d_ff or 4 * e
        inner = self.stem_channels if self.stem == "conv" else self.channels
        stem = (9 * self.channels * self.stem_channels + 9 * self.stem_channels**2) if self.stem == "conv" else 0
        per_layer = 4 * e * e + 2 * e * d_ff
        positions = (self.position_grid**2 if self.position_grid else self.num_patches) + 1
        return stem + inner * self.patch_size**2 * e + positions * e + enc.num_layers * per_layer + e * self.num_classes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "") -> VisionConfig:
        return from_fields(cls, d, where)


def sincos_2d(grid: int, dim: int) -> Tensor:
    """Fixed 2-D positions ``(grid * grid, dim)``: the first half of the dims encodes the row, the second the column,
    each as 1-D sine-cosine features (Vaswani et al.'s frequencies)."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (dim/4,)
    rows, cols = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64), indexing="ij"
    )
    out = []
    for coord in (rows.flatten(), cols.flatten()):
        angles = coord[:, None] * omega[None]  # (N, dim/4)
        out += [angles.sin(), angles.cos()]
    return torch.cat(out, 1).float()  # (N, dim)


class PatchEmbedding(nn.Module):
    """``(B, C, H, W)`` -> ``(B, N, E)``: optional conv stem, then a ``patch x patch`` stride-``patch`` projection."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        c, e, p = config.channels, config.encoder.d_model, config.patch_size
        if config.stem == "conv":
            s = config.stem_channels
            self.stem = nn.Sequential(
                nn.Conv2d(c, s, 3, padding=1), nn.GELU(), nn.Conv2d(s, s, 3, padding=1), nn.GELU()
            )
            c = s
        else:
            self.stem = None
        self.proj = nn.Conv2d(c, e, kernel_size=p, stride=p)

    def forward(self, images: Tensor) -> Tensor:
        x = images if self.stem is None else self.stem(images)  # (B, C', H, W)
        x = self.proj(x)  # (B, E, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, N, E), patches in row-major order


class VisionTransformer(nn.Module):
    """Images ``(B, C, H, W)`` (float, any scale; the training code feeds [-1, 1]) -> logits ``(B, classes)``.

    Hook points: ``hook_embed`` ``(B, T, E)`` (the encoder's input: [CLS] + patches + positions), and those of every
    block under ``encoder.layers.{i}.`` (``encoder.layers.0.attn.hook_pattern`` ``(B, H, T, T)``).
    """

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        check_size(config.parameter_estimate(), "the model")
        self.config = config
        e = config.encoder.d_model
        self.patch_embed = PatchEmbedding(config)
        self.cls = nn.Parameter(torch.zeros(1, 1, e)) if config.pooling == "cls" else None
        tokens = (config.position_grid**2 if config.position_grid else config.num_patches) + config.patch_offset
        if config.positional == "learned":
            self.pos = nn.Parameter(torch.randn(1, tokens, e) * 0.02)
        else:
            table = sincos_2d(config.grid, e)
            if config.patch_offset:
                table = torch.cat([torch.zeros(1, e), table])  # [CLS] gets no position
            self.register_buffer("pos", table[None], persistent=False)
        self.hook_embed = HookPoint()
        self.encoder = TransformerEncoder(config.encoder)
        self.norm = nn.LayerNorm(e, eps=config.encoder.layer_norm_eps) if not config.encoder.norm_first else None
        self.fc = nn.Linear(e, config.num_classes) if config.num_classes else None

    @classmethod
    def from_config(cls, config: VisionConfig) -> VisionTransformer:
        return cls(config)

    def check_images(self, images: Tensor) -> None:
        c = self.config
        want = (c.channels, c.image_size, c.image_size)
        if images.dim() == 3 and images.shape[0] == c.channels:
            raise ValueError(
                f"images must be (B, C, H, W); got one image {tuple(images.shape)}: add a batch axis "
                "with images.unsqueeze(0)"
            )
        if c.position_grid is not None:  # any size tiled by whole patches
            p = c.patch_size
            if (
                images.dim() != 4
                or images.shape[1] != c.channels
                or images.shape[2] % p
                or images.shape[3] % p
                or min(images.shape[2:]) < p
            ):
                raise ValueError(
                    f"images must be (B, {c.channels}, H, W) with H and W multiples of the patch size {p} "
                    f"(e.g. {c.image_size} x {c.image_size}); got {tuple(images.shape)}"
                )
        elif images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(
                f"images must be (B, {c.channels}, {c.image_size}, {c.image_size}) for this model "
                f"(channels={c.channels}, image_size={c.image_size}); got {tuple(images.shape)}"
            )
        if not images.is_floating_point():
            raise TypeError(f"images must be float (e.g. data.images.to_float(uint8_images)); got {images.dtype}")

    def positions(self, rows: int, cols: int) -> Tensor:
        """The position table ``(1, offset + rows * cols, E)`` for a grid of ``rows x cols`` patches: the learned
        table itself at its own grid, else its patch part interpolated bicubically (``align_corners=False``, as
        DINOv2 and ``timm``)."""
        c = self.config
        if c.position_grid is None or (rows, cols) == (c.position_grid, c.position_grid):
            return self.pos
        o = c.patch_offset
        g = c.position_grid
        table = self.pos[:, o:].reshape(1, g, g, -1).permute(0, 3, 1, 2)  # (1, E, g, g)
        table = torch.nn.functional.interpolate(table.float(), size=(rows, cols), mode="bicubic", align_corners=False)
        table = table.to(self.pos.dtype).permute(0, 2, 3, 1).reshape(1, rows * cols, -1)
        return torch.cat([self.pos[:, :o], table], 1)

    def features(self, images: Tensor, head_mask: Tensor | None = None) -> Tensor:
        """Token states ``(B, T, E)``: [CLS] (when pooling is cls) then the patches in row-major order."""
        self.check_images(images)
        x = self.patch_embed(images)  # (B, N, E)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)  # (B, 1 + N, E)
        p = self.config.patch_size
        x = self.hook_embed(x + self.positions(images.shape[2] // p, images.shape[3] // p))
        x = self.encoder(x, head_mask=head_mask)
        return x if self.norm is None else self.norm(x)

    def pool(self, x: Tensor) -> Tensor:
        return x[:, 0] if self.config.pooling == "cls" else x.mean(1)

    def forward(self, images: Tensor, head_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(B, classes)``; the pooled features ``(B, E)`` when ``num_classes=0``."""
        pooled = self.pool(self.features(images, head_mask))
        return pooled if self.fc is None else self.fc(pooled)

    def patch_centres(self, grid: tuple[int, int] | None = None) -> Tensor:
        """Pixel coordinates ``(N, 2)`` (row, column) of each patch's centre, in token order after the offset, for
        a grid of ``(rows, cols)`` patches (default: ``image_size``'s)."""
        c = self.config
        rows_n, cols_n = (c.grid, c.grid) if grid is None else grid
        r = torch.arange(rows_n, dtype=torch.float32) * c.patch_size + (c.patch_size - 1) / 2
        k = torch.arange(cols_n, dtype=torch.float32) * c.patch_size + (c.patch_size - 1) / 2
        rows, cols = torch.meshgrid(r, k, indexing="ij")
        return torch.stack([rows.flatten(), cols.flatten()], 1)


def mean_attention_distance(
    patterns: list[Tensor], model: VisionTransformer, grid: tuple[int, int] | None = None
) -> list[Tensor]:
    """Dosovitskiy et al.'s Fig. 7: per layer and head, the pixel distance between each patch query and the patches
    it attends to, weighted by the attention, averaged over queries and images. ``patterns`` are the layers'
    ``(B, H, T, T)`` weights (of images with ``grid`` ``(rows, cols)`` patches; default ``image_size``'s); [CLS]
    rows and columns are left out and each row renormalised over the patches. Returns one ``(H,)`` tensor per
    layer (pruned layers may have fewer heads)."""
    centres = model.patch_centres(grid)  # (N, 2)
    dist = torch.cdist(centres, centres)  # (N, N) pixels
    o = model.config.patch_offset
    out = []
    for p in patterns:
        w = p[:, :, o:, o:].double()  # (B, H, N, N)
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        out.append((w * dist.double()).sum(-1).mean((0, 2)).float())  # (H,)
    return out


__all__ = ["PatchEmbedding", "STEMS", "VisionConfig", "VisionTransformer", "mean_attention_distance", "sincos_2d"]
