"""What every epoch-based task on the run harness configures the same way (G2P, image classification, grounding):
the optimiser (:class:`EpochOptim`) and the run (:class:`EpochRun`), with one set of range rules. A task subclasses
them for its own defaults and fields; the harness reads the fields named here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class EpochOptim:
    epochs: int = 12
    batch_size: int = 128
    lr: float = 1e-3
    warmup: float = 0.05  # fraction of the steps spent warming up
    weight_decay: float = 0.05
    clip: float = 1.0
    label_smoothing: float = 0.1


@dataclass
class EpochRun:
    seed: int = 0
    threads: int | None = None
    progress: bool = True
    log: Literal["none", "tensorboard"] = "none"  # experiment tracking: TensorBoard event files in RUN/tensorboard


def optim_rules(o: EpochOptim) -> list[tuple[str, bool, str]]:
    """The optimiser's ranges, for every task configured by an :class:`EpochOptim`."""
    return [
        ("optim.epochs", o.epochs >= 1, ">= 1"),
        ("optim.batch_size", o.batch_size >= 1, ">= 1"),
        ("optim.lr", o.lr > 0, "> 0"),
        ("optim.warmup", 0 <= o.warmup < 1, "in [0, 1)"),
        ("optim.weight_decay", o.weight_decay >= 0, ">= 0"),
        ("optim.clip", o.clip >= 0, ">= 0"),
        ("optim.label_smoothing", 0 <= o.label_smoothing < 1, "in [0, 1)"),
    ]


__all__ = ["EpochOptim", "EpochRun", "optim_rules"]
