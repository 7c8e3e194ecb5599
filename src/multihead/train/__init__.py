"""Training: configs, the trainer, run folders (safetensors + JSON), DDP, metrics, inference.

The names below are imported when first asked for (PEP 562): a torch-free submodule such as :mod:`.presets` (the
command line's ``--preset`` choices) is read without loading PyTorch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    **dict.fromkeys(
        ("DataConfig", "OptimConfig", "PretrainedConfig", "RunConfig", "TrainConfig", "finetune_config"), ".config"
    ),
    **dict.fromkeys(("Run", "evaluate", "load_run", "predict"), ".inference"),
    "CheckpointError": ".runfolder",
    "RunExistsError": ".trainer",
    "train": ".trainer",
}

if TYPE_CHECKING:
    from .config import DataConfig, OptimConfig, PretrainedConfig, RunConfig, TrainConfig, finetune_config
    from .inference import Run, evaluate, load_run, predict
    from .runfolder import CheckpointError
    from .trainer import RunExistsError, train


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'multihead.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "CheckpointError",
    "DataConfig",
    "OptimConfig",
    "PretrainedConfig",
    "Run",
    "RunConfig",
    "RunExistsError",
    "TrainConfig",
    "evaluate",
    "finetune_config",
    "load_run",
    "predict",
    "train",
]
