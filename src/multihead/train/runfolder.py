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

How it is written (see :mod:`multihead._io`): a new run (or ``--overwrite``) is built in ``.RUN.new`` beside it and
swapped in by one rename once it is resumable (config, tokenizer, labels, split and a step-0 checkpoint); from then
on files are replaced one by one, atomically, while ``.RUN.lock`` is held. Before a model is built from the folder,
``config.json`` is validated and the shapes it implies are compared with ``model.safetensors``'s header.
"""

from __future__ import annotations

import json
from pathlib import Path

from .._io import atomic_write_bytes, atomic_write_json  # noqa: F401  (re-exported)
from .._weights import (  # noqa: F401  (re-exported: the run folder's weights are safetensors with a digest)
    CheckpointError,
    check_shapes,
    header_shapes,
    load_checked,
    load_tensors,
    meta_shapes,
    save_checked,
)


def read_json(path: Path, kind: type | None = None):
    """A JSON file of the run folder; ``kind`` (dict or list) is checked, so a hand-edited file gets a message."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; {path.parent} is not a complete multihead run folder")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); it is corrupt") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not UTF-8 text; it is corrupt") from None
    if kind is not None and not isinstance(value, kind):
        raise CheckpointError(
            f"{path} holds a JSON {type(value).__name__}, expected "
            f"{'an object' if kind is dict else 'a list'}; it is corrupt or not a multihead file"
        )
    return value


def is_task_run(path, section: str) -> bool:
    """Whether ``path`` is a run folder whose ``config.json`` has a ``section`` (``train``, ``g2p``, ``vision``,
    ``pretrain``): how each task recognises its own runs without raising on other folders."""
    p = Path(path) / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and section in cfg


__all__ = [
    "CheckpointError",
    "is_task_run",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_shapes",
    "header_shapes",
    "load_checked",
    "load_tensors",
    "meta_shapes",
    "read_json",
    "save_checked",
]
