"""Weights on disk, below every layer that saves or loads them: safetensors only (nothing is ever unpickled), a
digest of the tensors in the metadata that catches a truncated or modified file, and shape checks read from a file's
header -- compared with a module built on the meta device -- so a config that does not fit its weights is refused
before any memory is allocated. Used by run folders (:mod:`multihead.train.runfolder`) and HF folders
(:mod:`multihead.pretrained`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from ._io import atomic_write_bytes


class CheckpointError(RuntimeError):
    """A run folder or checkpoint that cannot be loaded; the message says why and what to do."""


def _missing(path: Path) -> CheckpointError:
    from ._io import lock_holder

    holder = lock_holder(path.parent)
    if holder is not None:
        return CheckpointError(
            f"{path} is not written yet: training in {path.parent} is in progress (locked by pid "
            f"{holder}); wait for its first evaluation, or for it to finish"
        )
    if (path.parent / "checkpoint" / "state.json").is_file():
        return CheckpointError(
            f"{path} is missing: training in {path.parent} stopped before its first evaluation. "
            f"Continue it with: multihead train --out {path.parent} --resume"
        )
    return CheckpointError(f"{path} is missing; {path.parent} is not a complete run folder")


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file; a missing or unreadable one raises :class:`CheckpointError`."""
    if not path.exists():
        raise _missing(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); it is truncated or corrupt. Restore it or retrain"
        ) from None


def header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from a safetensors header, without reading (or allocating) any tensor."""
    from safetensors import safe_open

    if not path.is_file():
        raise _missing(path)
    try:
        with safe_open(str(path), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); it is truncated or corrupt. Restore it or retrain"
        ) from None


def check_shapes(expected: dict[str, tuple], found: dict[str, tuple], path: Path, *, names=None) -> None:
    """Refuse weights that do not fit the model a config describes -- checked on shapes alone, before building it.
    ``names`` maps the names of ``expected`` to the file's, for messages. The one shape check of the package: run
    folders, checkpoints and every foreign format (:mod:`multihead.pretrained.state`) go through it."""
    show = names if names else (lambda k: k)
    missing = [k for k in expected if k not in found]
    extra = [k for k in found if k not in expected]
    if missing or extra:
        parts = [f"missing {[show(k) for k in missing[:4]]}"] if missing else []
        if extra:
            parts.append(f"unexpected tensor {extra[0]!r} (unexpected tensors: {extra[:4]})")
        raise CheckpointError(
            f"{path} does not fit the model its config describes: "
            + "; ".join(parts)
            + f" ({len(missing)} missing, {len(extra)} unexpected); config and weights disagree"
        )
    bad = [(k, found[k], expected[k]) for k in expected if tuple(found[k]) != tuple(expected[k])]
    if bad:
        k, got, want = bad[0]
        raise CheckpointError(
            f"{path}: {len(bad)} tensors have the wrong shape, e.g. {show(k)} is {tuple(got)} but the config "
            f"implies {tuple(want)}; config and weights disagree"
        )


def unique_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with tied tensors (one parameter under several names, e.g. an output projection tied
    to the embedding) kept once, under their first name: what a weights file holds (safetensors stores no shared
    tensors)."""
    out, seen = {}, set()
    for k, v in module.state_dict(keep_vars=True).items():
        if id(v) in seen:
            continue
        seen.add(id(v))
        out[k] = v.detach()
    return out


def meta_shapes(build) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of the module ``build()`` makes (tied ones once), built on the meta device (no memory
    allocated)."""
    with torch.device("meta"):
        module = build()
    return {k: tuple(v.shape) for k, v in unique_state(module).items()}


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
        raise CheckpointError(
            f"{path} has no content digest: it was not written by multihead; refusing to load it as a run checkpoint"
        )
    if _content_digest(tensors) != expected:
        raise CheckpointError(
            f"{path}: the tensors do not match the digest stored with them: the file was modified "
            "after it was written. Restore it or retrain; it was not loaded"
        )
    return tensors, meta


__all__ = [
    "CheckpointError",
    "check_shapes",
    "header_shapes",
    "load_checked",
    "load_tensors",
    "meta_shapes",
    "unique_state",
    "save_checked",
]
