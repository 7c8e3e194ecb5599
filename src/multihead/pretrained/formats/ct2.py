"""CTranslate2 model folders (``model.bin``, ``config.json``, ``tokenizer.json``), read here directly so that neither
``ctranslate2`` nor ``faster-whisper`` is needed. ``model.bin``: a uint32 version, the model's spec name, a revision,
then for each tensor its name, rank, dims, dtype id and byte count before its bytes, then aliases (CTranslate2's
``python/ctranslate2/specs/model_spec.py``). Every header is checked against the file's size before anything is read.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from ..errors import SourceError
from . import Read

DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # CTranslate2's DataType order
MAX_NAME = 4096
SPECS = {"WhisperSpec": "whisper"}  # CTranslate2 spec name -> the family that reads it


def claims(path: Path) -> bool:
    return path.is_dir() and (path / "model.bin").is_file()


def read_ct2(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {name: array})`` from a CTranslate2 ``model.bin``; aliases resolved. Arrays are views of one
    read of the file, every size checked against it first."""
    if Path(path).stat().st_size >= 2**32:
        raise SourceError(f"{path} is over 4 GB; CTranslate2 files this size are not supported")
    data = Path(path).read_bytes()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise SourceError(f"{path} ends early (at byte {len(data):,}, needed {pos + n:,}): the file is truncated")
        out = data[pos : pos + n]
        pos += n
        return out

    def u(fmt: str) -> int:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        n = u("H")
        if not 1 <= n <= MAX_NAME:
            raise SourceError(f"{path}: a name of {n} bytes at byte {pos}; the file is not a CTranslate2 model")
        raw = take(n)
        if raw[-1:] != b"\0":
            raise SourceError(f"{path}: a name without its terminating zero at byte {pos}; the file is damaged")
        return raw[:-1].decode("utf-8", errors="replace")

    version = u("I")
    if version not in (5, 6):
        raise SourceError(
            f"{path} is not a CTranslate2 model of a version read here (binary version {version}; 5 and 6 are read)"
        )
    name = string()
    u("I")  # revision
    count = u("I")
    if count > 100_000:
        raise SourceError(f"{path} declares {count:,} tensors; the file is not a CTranslate2 model")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(count):
        key = string()
        rank = u("B")
        dims = [u("I") for _ in range(rank)]
        dtype_id = u("B")
        nbytes = u("I")
        if dtype_id not in DTYPES:
            raise SourceError(
                f"{path}: {key} has data type {dtype_id}, which is not read here (float32, float16, int8, int16, int32)"
            )
        dtype = np.dtype(DTYPES[dtype_id])
        if math.prod(dims) * dtype.itemsize != nbytes:
            raise SourceError(
                f"{path}: {key} declares {nbytes:,} bytes for shape {dims} of {dtype}; the file is damaged"
            )
        if key in tensors:
            raise SourceError(f"{path}: tensor {key!r} is stored twice; the file is damaged")
        tensors[key] = np.frombuffer(take(nbytes), dtype=dtype).reshape(dims)
    if pos < len(data):
        for _ in range(u("I")):
            alias, target = string(), string()
            if target not in tensors or alias in tensors:
                raise SourceError(
                    f"{path}: alias {alias!r} -> {target!r} names no tensor, or a name already taken; the file is damaged"
                )
            tensors[alias] = tensors[target]
    if pos != len(data):
        raise SourceError(f"{path}: {len(data) - pos:,} bytes follow the last entry; the file is damaged")
    return name, tensors


def read(path: Path) -> Read:
    """The tensors under CTranslate2's names (as float32 when fetched), ``config.json`` as ``meta`` and, as the
    config, ``model_type`` from the spec name (CTranslate2 stores no architecture: the family reads it from the
    shapes and the stored head counts)."""
    from .hf import read_json

    folder = Path(path)
    spec, arrays = read_ct2(folder / "model.bin")
    quantised = [k for k, a in arrays.items() if a.ndim >= 1 and a.dtype.kind in "iu" or k.endswith("weight_scale")]
    if quantised:  # int8 weights are only meaningful with their scales, which a float model does not apply
        raise SourceError(
            f"{folder / 'model.bin'} holds quantised weights ({quantised[0]}, ...); multihead reads float32 and "
            "float16 CTranslate2 models: convert it again with --quantization float16"
        )
    meta = read_json(folder / "config.json", "CTranslate2 config") if (folder / "config.json").is_file() else {}
    import torch

    from ..state import Lazy

    tensors = {
        k: Lazy(tuple(int(d) for d in a.shape), lambda a=a: torch.from_numpy(np.array(a, dtype=np.float32)))
        for k, a in arrays.items()
    }
    config = {"model_type": SPECS.get(spec, spec), "ct2_spec": spec}
    return Read(folder, "ct2", config, tensors, meta)


__all__ = ["DTYPES", "claims", "read", "read_ct2"]
