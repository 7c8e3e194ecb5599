"""HF model folders: ``config.json`` and the weights in ``model.safetensors``, in shards named by
``model.safetensors.index.json``, or in ``pytorch_model.bin``.

One policy for ``pytorch_model.bin``, for every family: it is read with ``torch.load(weights_only=True, mmap=True)``
and nothing else. ``weights_only`` is PyTorch's restricted unpickler (tensors, dicts, lists and numbers only; a file
that needs any other global is refused, and the refusal never suggests ``weights_only=False``), so no code in the file
runs; ``mmap`` maps the storages instead of reading them, so shapes are checked against the config before any tensor is
copied. Many BERT and GPT-2 folders exist only in this format, which is why it is read rather than refused. Sharded
``.bin`` checkpoints are refused (convert them to safetensors).
"""

from __future__ import annotations

import re
from pathlib import Path

from typing import TYPE_CHECKING

from ..errors import SourceError
from . import Read

if TYPE_CHECKING:
    from ..state import Lazy

MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few kilobytes


def claims(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists()  # a config that is no regular file is refused by name


def read_json(path: Path, what: str = "config") -> dict:
    """A JSON object from ``path``; a missing, huge, invalid, deeply nested or non-object file is refused with the
    reason (:func:`multihead._io.read_json_file`)."""
    from ..._io import JSONFileError, read_json_file

    if not path.exists():
        raise SourceError(f"{path.parent} has no {path.name}; an HF model folder needs config.json and its weights")
    try:
        value = read_json_file(path, max_bytes=MAX_CONFIG_BYTES)
    except JSONFileError as exc:
        raise SourceError(f"{exc}; the folder's {what} is corrupt: it is not an HF {what}") from None
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path} holds a JSON {type(value).__name__}, not an object; it is not an HF {what}")
    return value


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.exists():
        raise SourceError(
            f"{folder} has no config.json; an HF model folder needs config.json and model.safetensors "
            "(or pytorch_model.bin)"
        )
    config = read_json(path)
    why = why_not_weights(config)
    if why is not None:
        raise SourceError(f"{path}: {why}")
    return config


def why_not_weights(config: dict) -> str | None:
    """Why the weights a config describes are not read (None: they are): quantised checkpoints, whose tensors are
    packed integers plus scales (bitsandbytes, GPTQ, AWQ, ...) that read as floats would be a different model; and
    folders whose ``auto_map`` names their own modelling code, which multihead never runs (and which the
    library's class of the same ``model_type`` need not equal). Every reader refuses them, native and attached
    alike, before anything is loaded."""
    auto_map = config.get("auto_map")
    if auto_map:
        names = ", ".join(sorted(map(str, auto_map.values())))[:200] if isinstance(auto_map, dict) else str(auto_map)
        return (
            f"its config.json names the folder's own modelling code (auto_map: {names}); multihead never runs code "
            "from a model folder, and transformers' built-in class of the same model_type need not be that model. "
            "Load it yourself with transformers (trust_remote_code=True, after reading the code) and attach it from "
            "Python (multihead.hf.attach), or save it as a built-in architecture"
        )
    quant = config.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else type(quant).__name__
    return (
        f"it is a quantised checkpoint (quantization_config, quant_method {method!r}); multihead reads float "
        "weights only (float32, float16 or bfloat16): dequantise it and save it again, e.g. "
        "model.dequantize() then save_pretrained(..., safe_serialization=True), or load it with the library that "
        "quantised it"
    )


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder`` (one, or the shards its index names), or ``[pytorch_model.bin]``."""
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SourceError(f"{index} is not a valid shard index (its weight_map must name files); it is corrupt")
        files = []
        for n in sorted(set(weight_map.values())):
            p = (folder / n).resolve()
            if p.parent != folder.resolve() or not p.is_file():
                raise SourceError(f"{index} names a shard {n!r} that is not a file in {folder}")
            files.append(p)
        return files
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    if (folder / "pytorch_model.bin.index.json").is_file():
        raise SourceError(
            f"{folder} holds a sharded pytorch_model.bin checkpoint; multihead reads shards from safetensors only: "
            "convert it with a tool you trust"
        )
    raise SourceError(
        f"{folder} has no model.safetensors or pytorch_model.bin (nor model.safetensors.index.json with shards)"
    )


def _safetensors(path: Path) -> dict[str, Lazy]:
    from safetensors import SafetensorError, safe_open

    from ..state import Lazy

    def reader(name: str):
        def read():
            try:
                with safe_open(str(path), "pt") as f:
                    return f.get_tensor(name)
            except (SafetensorError, OSError, ValueError) as exc:
                raise SourceError(f"{path}: {name} is unreadable ({exc}); the file is truncated or corrupt") from None

        return read

    try:
        with safe_open(str(path), "pt") as f:
            return {k: Lazy(tuple(f.get_slice(k).get_shape()), reader(k)) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise SourceError(
            f"{path} is not a readable safetensors file ({exc}); it is truncated or corrupt: download or export "
            "it again"
        ) from None


def _pickled_tensors(path: Path) -> dict[str, Lazy]:
    import torch

    from ..state import Lazy

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a file that needs pickled code is refused, never executed
        found = re.search(r"Unsupported global: GLOBAL [\w.]+", str(exc))
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        # torch's own message suggests retrying with weights_only=False: never repeat that advice
        detail = (
            found.group(0)
            if found
            else ("it needs pickled code to load" if "weights_only" in str(exc) else f"{type(exc).__name__}: {first}")
        )
        raise SourceError(
            f"{path} could not be read as plain tensors ({detail}); multihead never runs pickled code (never "
            "pickled objects, only plain tensors): convert it to model.safetensors with a tool you trust"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SourceError(f"{path} does not hold a flat dict of tensors; it is not an HF checkpoint")
    return {k: Lazy(tuple(v.shape), lambda v=v: v) for k, v in state.items()}


def read_tensors(folder: Path) -> dict[str, Lazy]:
    tensors: dict[str, Lazy] = {}
    for f in weight_files(folder):
        tensors.update(_pickled_tensors(f) if f.suffix == ".bin" else _safetensors(f))
    return tensors


def read(path: Path) -> Read:
    folder = Path(path)
    return Read(folder, "hf", read_config(folder), read_tensors(folder))


__all__ = ["claims", "read", "read_config", "read_json", "read_tensors", "weight_files", "why_not_weights"]
