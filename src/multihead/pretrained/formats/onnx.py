"""ONNX graphs exported from HF modules (``torch.onnx.export`` of a ``transformers`` model), read with the ``onnx``
package (the format's own reader: protobuf, no pickle; shapes from the initializers' headers).

Exporters leave matrices unnamed (``onnx::MatMul_1234``) and merge tensors that happen to be equal, so a weight is
never found by its own name but through the node that consumes it: node names carry the module path
(``/backbone/encoder/layer.3/attention/attention/query/MatMul``), which gives the HF parameter name
(``backbone.encoder.layer.3.attention.attention.query.weight``; a ``MatMul`` weight stored ``(in, out)`` is
transposed). LayerNorms exported as arithmetic give ``weight`` (their ``Mul``) and ``bias`` (their ``Add_1``), a
LayerScale ``Mul`` gives ``lambda1``. The family strips a wrapper's prefix (``backbone.``) and reads the config from
the shapes; only graphs whose module paths are those of HF's ``Dinov2Model`` are recognised today (``model_type``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..errors import SourceError
from ..state import Lazy
from . import Read

MAX_BYTES = 2**31  # protobuf's own limit on one file without external data


def claims(path: Path) -> bool:
    return path.is_file() and path.suffix == ".onnx"


def read_graph(path: Path):
    import onnx

    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SourceError(f"{path} is {size:,} bytes, more than one ONNX file holds without external data")
    with open(path, "rb") as f:
        if f.read(1) != b"\x08":  # a ModelProto starts with field 1 (ir_version), a varint
            raise SourceError(f"{path} is not an ONNX model file")
    try:
        return onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError and friends)
        raise SourceError(f"{path} is not a readable ONNX file ({exc})") from None


_FLOATS = {1: 4, 10: 2, 11: 8, 16: 2}  # TensorProto data types read as weights: FLOAT, FLOAT16, DOUBLE, BFLOAT16


def _check_initializer(path: Path, t) -> None:
    """A weight's header against its payload, before it is read: a float type, stored in the file (not external
    data), as many bytes as its dims say."""
    what = f"{path}: initializer {t.name!r}"
    if t.data_type not in _FLOATS:
        raise SourceError(f"{what} has ONNX data type {t.data_type}, not a float type; it holds no weights")
    if t.data_location == 1 or t.external_data:
        raise SourceError(f"{what} is stored in an external file; multihead reads single-file ONNX models only")
    if any(d < 0 for d in t.dims):
        raise SourceError(f"{what} has negative dimensions {list(t.dims)}; the file is corrupt")
    n = math.prod(t.dims)
    if t.raw_data:
        if len(t.raw_data) != n * _FLOATS[t.data_type]:
            raise SourceError(
                f"{what} holds {len(t.raw_data):,} bytes for dims {list(t.dims)} ({n * _FLOATS[t.data_type]:,} "
                "expected); the file is corrupt: export it again"
            )
    else:
        stored = (
            len(t.double_data)
            if t.data_type == 11
            else len(t.int32_data)
            if t.data_type in (10, 16)
            else len(t.float_data)
        )
        if stored != n:
            raise SourceError(
                f"{what} holds {stored:,} values for dims {list(t.dims)}; the file is corrupt: export it again"
            )


_NORMS = ("norm1", "norm2", "layernorm", "layernorm_before", "layernorm_after", "LayerNorm")


def _targets(node) -> list[tuple[str, str, bool]]:
    """``(input name, HF parameter name, transpose)`` for the weights one node consumes."""
    path = node.name.strip("/").split("/")
    if len(path) < 2:
        return []
    module, op, ins = ".".join(path[:-1]), path[-1], list(node.input)
    last = path[-2]
    if node.op_type == "Conv" and len(ins) == 3:
        return [(ins[1], f"{module}.weight", False), (ins[2], f"{module}.bias", False)]
    if last == "embeddings" and node.op_type == "Expand":
        return [(ins[0], f"{module}.cls_token", False)]
    if last in _NORMS:  # a LayerNorm as arithmetic: x / std * weight (Mul), + bias (Add_1)
        what = {("Mul", "Mul"): "weight", ("Add_1", "Add"): "bias"}.get((op, node.op_type))
        return [(i, f"{module}.{what}", False) for i in ins] if what else []
    if last.startswith("layer_scale") and node.op_type == "Mul":
        return [(i, f"{module}.lambda1", False) for i in ins]
    if node.op_type == "MatMul":
        return [(i, f"{module}.weight", True) for i in ins]
    if node.op_type == "Add" and op == "Add":
        return [(i, f"{module}.bias", False) for i in ins]
    return []


def read(path: Path) -> Read:
    from onnx import numpy_helper

    graph = read_graph(Path(path))
    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    # the exporter stores equal tensors once and passes the copies through Identity nodes
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in inits}
    wanted: dict[str, tuple[str, bool]] = {}
    eps = None
    for node in graph.node:
        for name, hf, transpose in _targets(node):
            name = alias.get(name, name)
            if name in inits:
                wanted[hf] = (name, transpose)
        if node.name.endswith("norm1/Add") and eps is None:  # var + eps: the LayerNorm's epsilon
            c = next((consts[i] for i in node.input if i in consts), None)
            if c is not None:
                eps = float(numpy_helper.to_array(c.attribute[0].t))
    cls = next((k for k in wanted if k.endswith("embeddings.cls_token")), None)
    layer_scale = any(".layer_scale1." in k for k in wanted)
    if cls is None or not any(".patch_embeddings.projection.weight" in k for k in wanted) or not layer_scale:
        raise SourceError(
            f"{path} is not a DINOv2 export (HF Dinov2Model): no patch embedding, [CLS] token, LayerScale or encoder "
            "layers found; ONNX graphs of other models are not read"
        )
    e = int(inits[wanted[cls][0]].dims[-1])
    # the position table: one (1, n * n, E) initializer and the [CLS] position (1, 1, E), concatenated by the graph
    pos = [
        n
        for n, t in inits.items()
        if len(t.dims) == 3
        and t.dims[0] == 1
        and t.dims[2] == e
        and n != wanted[cls][0]
        and t.dims[1] > 1
        and math.isqrt(int(t.dims[1])) ** 2 == t.dims[1]
    ]
    cls_pos = [n for n, t in inits.items() if tuple(t.dims) == (1, 1, e) and n != wanted[cls][0]]
    if len(pos) != 1 or len(cls_pos) != 1:
        raise SourceError(
            f"{path}: cannot find the position table (one (1, 1, {e}) and one (1, n * n, {e}) initializer besides "
            "the [CLS] token); is this a DINOv2 export (HF Dinov2Model)?"
        )
    prefix = cls[: -len("embeddings.cls_token")]

    def array(name: str, transpose: bool):
        def read_one():
            t = torch.from_numpy(numpy_helper.to_array(inits[name]).copy()).float()
            return t.t().contiguous() if transpose else t

        return read_one

    for name in {n for n, _ in wanted.values()} | {pos[0], cls_pos[0]}:
        _check_initializer(path, inits[name])
    tensors = {}
    for hf, (name, transpose) in wanted.items():
        dims = tuple(int(d) for d in inits[name].dims)
        tensors[hf] = Lazy(dims[::-1] if transpose else dims, array(name, transpose))
    n = int(inits[pos[0]].dims[1])
    tensors[f"{prefix}embeddings.position_embeddings"] = Lazy(
        (1, 1 + n, e), lambda: torch.cat([array(cls_pos[0], False)(), array(pos[0], False)()], 1)
    )
    layers = {k for k in wanted if ".encoder.layer." in f".{k}"}
    num_layers = 1 + max(int(k.split("encoder.layer.")[1].split(".")[0]) for k in layers)
    patch = int(inits[wanted[f"{prefix}embeddings.patch_embeddings.projection.weight"][0]].dims[-1])
    d_ff = int(inits[wanted[f"{prefix}encoder.layer.0.mlp.fc1.weight"][0]].dims[1])
    config = {
        "model_type": "dinov2",
        "hidden_size": e,
        "num_hidden_layers": num_layers,
        "num_attention_heads": max(1, e // 64),  # 64-wide heads in every DINOv2 (the graph does not store it)
        "mlp_ratio": d_ff / e,
        "patch_size": patch,
        "image_size": math.isqrt(n) * patch,
        "num_channels": 3,
        "layer_norm_eps": 1e-6 if eps is None else float(f"{eps:.6g}"),  # a float32 constant: 1e-6, not 9.99e-07
        "hidden_act": "gelu",
    }
    return Read(Path(path), "onnx", config, tensors)


__all__ = ["claims", "read", "read_graph"]
