"""Training: configs, the trainer, run folders (safetensors + JSON), DDP, metrics, inference."""

from .config import DataConfig, OptimConfig, PretrainedConfig, RunConfig, TrainConfig, finetune_config
from .inference import Run, evaluate, load_run, predict
from .runfolder import CheckpointError
from .trainer import RunExistsError, train

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
