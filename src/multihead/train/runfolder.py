"""The run folder: atomic writes, safetensors + JSON only (nothing is ever unpickled), checksums that catch a
truncated or tampered checkpoint with a clear message.

::

    RUN/config.json        TrainConfig (data, model, optim, run)
    RUN/model.safetensors  best weights (by validation score), with a digest of its tensors in the metadata
    RUN/tokenizer.json     HF tokenizers file
    RUN/labels.json        class names in output order
    RUN/splits.json        the fixed split (indices into the de-duplicated data)
    RUN/metrics.jsonl      one JSON object per evaluation / log event
    RUN/results.json       final test metrics, baseline, timings
    RUN/curves.png, RUN/confusion.png
    RUN/checkpoint/        state to --resume an interrupted run (weights, optimizer, RNG, position)
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from .._io import atomic_write_bytes, atomic_write_json  # noqa: F401  (re-exported)


class CheckpointError(RuntimeError):
    """A run folder or checkpoint that cannot be loaded; the message says why and what to do."""


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file; a missing or unreadable one raises :class:`CheckpointError`."""
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the run folder is incomplete (was training interrupted before "
                              "the first checkpoint?). Re-run training, or train with --resume")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc}); it is truncated or corrupt. "
                              "Restore it or retrain") from None


def read_json(path: Path) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path} is missing; {path.parent} is not a complete multihead run folder")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); it is corrupt") from None


def _content_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_checked(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Atomic safetensors write whose metadata carries a digest of the tensors, verified by :func:`load_checked`."""
    meta = dict(metadata or {})
    meta["content_sha256"] = _content_digest(tensors)
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=meta)
    atomic_write_bytes(path, data)  # temp file + fsync + rename


def load_checked(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load a file written by :func:`save_checked`; a truncated or modified file raises :class:`CheckpointError`."""
    from safetensors import safe_open

    tensors = load_tensors(path)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    expected = meta.get("content_sha256")
    if expected is None:
        raise CheckpointError(f"{path} has no content digest: it was not written by multihead; refusing to load it "
                              "as a run checkpoint")
    if _content_digest(tensors) != expected:
        raise CheckpointError(f"{path}: the tensors do not match the digest stored with them: the file was modified "
                              "after it was written. Restore it or retrain; it was not loaded")
    return tensors, meta
