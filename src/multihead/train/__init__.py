"""Training: configs, the trainer, run folders (safetensors + JSON), DDP, metrics."""
from .config import DataConfig, OptimConfig, RunConfig, TrainConfig
from .runfolder import CheckpointError
from .trainer import RunExistsError, train

__all__ = ["CheckpointError", "DataConfig", "OptimConfig", "RunConfig", "RunExistsError", "TrainConfig", "train"]
