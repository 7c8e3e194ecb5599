"""Experiment tracking for the run harness (``run.log = "tensorboard"``, ``--log tensorboard``): every event of
``metrics.jsonl`` also goes to TensorBoard event files in ``RUN/tensorboard/`` (``train/loss``, ``eval/val_accuracy``,
...), and the pictures the task draws at the end as images; nothing leaves the machine. A resume purges the events
logged after its checkpoint, as ``metrics.jsonl`` drops its lines.
"""

from __future__ import annotations

from pathlib import Path

from .._config import ConfigError


def _writer(folder: Path, purge_step: int | None = None):
    """A TensorBoard writer in ``folder/tensorboard`` (a missing package is named, with the install line)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "--log tensorboard needs the tensorboard package: pip install 'multihead[tensorboard]' (or drop --log)"
        ) from None
    return SummaryWriter(str(folder / "tensorboard"), purge_step=purge_step)


class Tracker:
    """TensorBoard event files of one run (rank 0); :meth:`reopen` follows the run folder when it is published."""

    def __init__(self, folder: Path, purge_step: int | None) -> None:
        self.writer = _writer(folder, purge_step)

    def event(self, event: dict) -> None:
        """Every number of a ``metrics.jsonl`` event as a scalar ``{event}/{key}`` at its step."""
        for key, value in event.items():
            if (
                key not in ("event", "step", "epoch")
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
            ):
                self.writer.add_scalar(f"{event['event']}/{key}", value, event["step"])
        self.writer.flush()

    def pictures(self, folder: Path, step: int) -> None:
        """The run folder's finished pictures (curves, confusion...) as images."""
        import numpy as np
        from PIL import Image

        for png in sorted(folder.glob("*.png")):
            with Image.open(png) as im:
                self.writer.add_image(png.stem, np.asarray(im.convert("RGB")), step, dataformats="HWC")

    def reopen(self, folder: Path) -> None:
        """Continue in ``folder`` (the staged run's files moved there with it)."""
        self.writer = _writer(folder)

    def close(self) -> None:
        self.writer.close()


def open(config, folder: Path, purge_step: int, main: bool = True) -> Tracker | None:  # noqa: A001
    """A tracker when the run asks for one (``config.run.log``) on the main process; None otherwise."""
    if not main or getattr(config.run, "log", "none") == "none":
        return None
    return Tracker(folder, purge_step)


__all__ = ["Tracker", "open"]
