"""Training: configs, the trainer, run folders (safetensors + JSON), DDP, metrics, inference."""
from .config import DataConfig, OptimConfig, RunConfig, TrainConfig
from .inference import Run, evaluate, load_run, predict
from .runfolder import CheckpointError
from .trainer import RunExistsError, train

__all__ = ["CheckpointError", "DataConfig", "OptimConfig", "Run", "RunConfig", "RunExistsError", "TrainConfig",
           "evaluate", "load_run", "predict", "train"]
