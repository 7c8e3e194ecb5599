"""Image classification with a :class:`~multihead.models.vision.VisionTransformer`: train, evaluate, predict.

``multihead train --data fashion_mnist --out runs/vit`` (or ``--data digits``) lands here: the task is picked from
the data. The run folder keeps the classifier's contract (:mod:`multihead.train.runfolder`): built beside ``--out``
and swapped in once resumable, locked while written, every file atomic, weights in digest-checked safetensors::

    RUN/config.json        {"vision": VisionTrainConfig}
    RUN/labels.json        class names in output order
    RUN/splits.json        the fixed split (validation indices into the training images; the official test set)
    RUN/model.safetensors  best weights by validation accuracy
    RUN/metrics.jsonl      training loss/accuracy, validation accuracy per epoch, minutes
    RUN/results.json       test accuracy / macro-F1 / confusion, the pixel baseline, timings, parameters
    RUN/curves.png, RUN/confusion.png
    RUN/checkpoint/        what --resume needs (weights, optimizer, schedule, position)

The recipe (defaults): the hybrid convolutional stem (32 channels), patch 4 (49 tokens for 28x28), d_model 128, 4
heads, 4 pre-LN blocks, FFN 256, GELU, [CLS] pooling, learned positions; AdamW (lr 1e-3, weight decay 0.05), 5%
warm-up then cosine decay, label smoothing 0.1, random shifts of up to 2 pixels (a 14th of the image side), 12
epochs. ``--set model.stem=patch`` gives the paper's plain patch embedding.
The baseline beside it (``results.json``'s ``baseline_pixels_logreg``): scikit-learn's logistic regression on the raw
pixels, same split.
"""

from __future__ import annotations


import time
from .epochs import EpochOptim, EpochRun, optim_rules
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._config import ConfigError, check_rules, flatten, from_fields, unflatten
from ..data import images as I
from ..data.splits import Splits
from ..models.vision import VisionConfig, VisionTransformer
from .checkpoint import load_task_weights, read_task_config
from .harness import Step, Task, run_task
from .metrics import plot_confusion, scores
from .runfolder import atomic_write_json, is_task_run, read_json


@dataclass
class VisionData:
    name: str = "fashion_mnist"  # fashion_mnist | digits
    path: str | None = None  # folder of Fashion-MNIST's IDX files (default: $MULTIHEAD_FASHION_MNIST, then Debian's)
    split_seed: int = 0
    limit: int | None = None  # at most N training images, seeded, stratified by class (quick runs)
    eval_limit: int | None = None  # at most N images of validation and of test (None: all of them)
    shift: int | None = None  # augmentation: random shifts of up to this many pixels (0: none; None: size / 14)


@dataclass
class VisionOptim(EpochOptim):
    epochs: int = 12  # ~1.5 min per Fashion-MNIST epoch on 2 cores (hybrid stem)


@dataclass
class VisionRun(EpochRun):
    baseline: bool = True  # fit the pixel logistic-regression baseline at the end


@dataclass
class VisionTrainConfig:
    data: VisionData = field(default_factory=VisionData)
    # The hybrid stem by default. Measured side by side on Fashion-MNIST (12 epochs, 2 cores; docs/vision.md): hybrid test
    # 0.8998 in 19.9 min, plain 0.8966 in 15.4 min -- about equal per minute, the hybrid ends a little higher;
    # --set model.stem=patch for the paper's ViT.
    model: VisionConfig = field(default_factory=lambda: VisionConfig(stem="conv"))
    optim: VisionOptim = field(default_factory=VisionOptim)
    run: VisionRun = field(default_factory=VisionRun)

    def __post_init__(self) -> None:
        """Ranges, checked before anything is read, allocated or written."""
        d = self.data
        check_rules(
            [
                ("data.name", I.is_image_dataset(d.name), f"one of {', '.join(I.IMAGE_DATASETS)}"),
                ("data.limit", d.limit is None or d.limit >= 8, ">= 8"),
                ("data.eval_limit", d.eval_limit is None or d.eval_limit >= 8, ">= 8"),
                ("data.shift", d.shift is None or 0 <= d.shift <= 16, "in [0, 16]"),
                *optim_rules(self.optim),
            ]
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> VisionTrainConfig:
        return from_fields(cls, d)


# flags of `multihead train` that mean something here (the rest are refused by name)
_FLAGS = {
    "optim.epochs",
    "optim.batch_size",
    "optim.lr",
    "optim.weight_decay",
    "optim.warmup",
    "optim.clip",
    "optim.label_smoothing",
    "model.encoder.d_model",
    "model.encoder.num_heads",
    "model.encoder.num_kv_heads",
    "model.encoder.num_layers",
    "model.encoder.d_ff",
    "model.encoder.dropout",
    "model.encoder.backend",
    "model.encoder.norm_first",
    "model.positional",
    "model.pooling",
    "data.limit",
    "data.name",
    "run.seed",
    "run.threads",
    "run.progress",
}


def merge_overrides(flat: dict, defaults, task: str, flags=frozenset()) -> dict:
    """``multihead train``'s flattened overrides over a task config's ``defaults``; keys that are neither the
    config's fields nor ``flags`` are refused by name (flags that only mean something for text)."""
    base = flatten(defaults.to_dict())
    unknown = [k for k in flat if k not in base and k not in flags]
    if unknown:
        raise ConfigError(
            f"invalid config: {', '.join(sorted(unknown))} do not apply to {task} (--data "
            f"{flat.get('data.name', base['data.name'])}); its fields are: {', '.join(sorted(base))}"
        )
    return {**base, **flat}


def config_from_overrides(over: dict) -> VisionTrainConfig:
    """A vision config from ``multihead train``'s layered overrides (flags, TOML, ``--set``); flags that only mean
    something for text are refused by name."""
    merged = merge_overrides(flatten(over), VisionTrainConfig(), "image classification", _FLAGS)
    shape = I.IMAGE_SHAPES.get(merged["data.name"])
    if shape:  # the model's input size is the data's: patch sizes are checked against it up front
        merged["model.channels"], merged["model.image_size"] = shape[0], shape[1]
    return VisionTrainConfig.from_dict(unflatten(merged))


# ---------------------------------------------------------------------------------------------------- data
def prepare(config: VisionTrainConfig) -> Splits:
    splits = I.load_images(config.data.name, path=config.data.path, seed=config.data.split_seed)
    return splits.limit(config.data.limit, config.data.split_seed, eval_keep=config.data.eval_limit)


def _model_config(config: VisionTrainConfig, splits: Splits) -> VisionConfig:
    c, h, w = splits.train.image_shape
    if h != w:
        raise I.ImageDataError(f"the ViT takes square images; {splits.name} has {h}x{w}")
    mc = config.model.to_dict()
    mc.update(image_size=h, channels=c, num_classes=len(splits.label_names))
    if h % mc["patch_size"]:  # e.g. digits (8x8) with the default patch 4 fits; say what does otherwise
        fits = [p for p in range(1, h + 1) if h % p == 0]
        raise ConfigError(
            f"patch_size={mc['patch_size']} does not tile {h}x{h} images; choose one of {fits} "
            "(--set model.patch_size=...)"
        )
    return VisionConfig.from_dict(mc, "model")


@torch.no_grad()
def predict_images(
    model: VisionTransformer, images: torch.Tensor, *, batch_size: int = 512, head_mask=None
) -> torch.Tensor:
    """Class probabilities ``(N, C)`` for uint8 images ``(N, C, H, W)``."""
    model.eval()
    out = []
    for i in range(0, len(images), batch_size):
        out.append(torch.softmax(model(I.to_float(images[i : i + batch_size]), head_mask=head_mask).float(), -1))
    return torch.cat(out) if out else torch.empty(0, model.config.num_classes)


def evaluate_images(model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor, *, head_mask=None) -> dict:
    probs = predict_images(model, images, head_mask=head_mask)
    out = scores(labels.tolist(), probs.argmax(-1).tolist(), model.config.num_classes)
    out["loss"] = F.nll_loss(probs.clamp_min(1e-12).log(), labels).item()
    return out


def pixel_baseline(splits: Splits) -> dict:
    """Logistic regression on raw pixels (scaled to [0, 1]), fitted on the training split, scored on the test split."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    t = time.perf_counter()
    x_train = splits.train[0].flatten(1).float().div(255).numpy()
    x_test = splits.test[0].flatten(1).float().div(255).numpy()
    clf = LogisticRegression(max_iter=200)
    with warnings.catch_warnings():  # lbfgs may stop at 200 iterations short of its tolerance: the score is reported
        warnings.simplefilter("ignore", category=ConvergenceWarning)
        clf.fit(x_train, splits.train[1].numpy())
    acc = float((clf.predict(x_test) == splits.test[1].numpy()).mean())
    return {
        "model": "logistic regression on raw pixels (scikit-learn, lbfgs, 200 iterations)",
        "accuracy": acc,
        "seconds": time.perf_counter() - t,
    }


# ---------------------------------------------------------------------------------------------------- training
def train_vision(
    config: VisionTrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    given: dict | None = None,
) -> dict:
    """Train, evaluate and save an image-classification run folder; returns ``results.json``'s contents."""
    return run_task(VisionTask, config, out, resume=resume, overwrite=overwrite, given=given)


class VisionTask(Task):
    """Image classification on the run harness: shifted images in, class logits out, accuracy as the score."""

    section = "vision"  # config.json's section
    config_from_overrides = staticmethod(config_from_overrides)
    schedule = "cosine"
    log_every = 100
    no_decay_names = ("cls", "pos")

    @classmethod
    def inputs(cls, config) -> dict[str, str]:
        found = super().inputs(config)
        if config.data.name == "fashion_mnist" and not config.data.path:  # the default folder is read too
            try:
                found["data.path"] = str(I.fashion_dir())
            except I.ImageDataError:
                pass  # not installed: reported when the data is read
        return found

    def __init__(self, config: VisionTrainConfig, path: Path, resume: bool) -> None:
        super().__init__(config, path, resume)
        self.splits = self.prepare()  # data problems are reported before the run folder is touched
        torch.manual_seed(config.run.seed)
        self.model = self.build_model()

    # what a task on images changes (the grounding task subclasses these) ------------------------------------
    def prepare(self) -> Splits:
        return prepare(self.config)

    def build_model(self) -> nn.Module:
        self.config.model = _model_config(self.config, self.splits)
        size = self.config.model.image_size
        self.shift = round(size / 14) if self.config.data.shift is None else self.config.data.shift  # 2 px at 28x28
        return VisionTransformer(self.config.model)

    def label_names(self) -> list[str]:
        return self.splits.label_names

    def train_size(self) -> int:
        return len(self.splits.train[1])

    def train_batch(self, idx: torch.Tensor, g: torch.Generator) -> tuple[tuple, torch.Tensor]:
        """The model's inputs and the labels for the training examples ``idx``; ``g`` is seeded by the step."""
        x_all, y_all = self.splits.train
        return (I.to_float(I.random_shift(x_all[idx], self.shift, g)),), y_all[idx]

    def validate(self, model: nn.Module) -> dict:
        val = evaluate_images(model, *self.splits.validation)
        return {"score": val["accuracy"], "loss": val["loss"], "accuracy": val["accuracy"]}

    def write_start(self, path: Path) -> None:
        atomic_write_json(path / "config.json", {self.section: self.config.to_dict()})
        atomic_write_json(path / "labels.json", self.label_names())
        atomic_write_json(path / "splits.json", self.splits.record)

    def finish(self, path: Path, run: dict) -> dict:
        return finish(path, self.config, self.splits, minutes=run["seconds"] / 60, best_epoch=run["best_epoch"])

    # the harness's questions ---------------------------------------------------------------------------------
    def batches(self, epoch: int) -> list[torch.Tensor]:
        """The epoch's batches of training indices: a permutation seeded by (seed, epoch), so a resumed run sees
        the same order."""
        g = torch.Generator().manual_seed(self.config.run.seed * 1_000_003 + epoch)
        order = torch.randperm(self.train_size(), generator=g)
        return list(order.split(self.config.optim.batch_size))

    def total_steps(self) -> int:
        return self.epochs * -(-self.train_size() // self.config.optim.batch_size)

    def loss(self, model: nn.Module, batch: torch.Tensor, step: int, part: slice) -> Step:
        g = torch.Generator().manual_seed(self.config.run.seed * 1_000_003 + step)  # randomness of step n
        inputs, y = self.train_batch(batch, g)  # the global batch, then this rank's share
        inputs, y = tuple(x[part] for x in inputs), y[part]
        logits = model(*inputs)
        loss = F.cross_entropy(logits, y, label_smoothing=self.config.optim.label_smoothing)
        return Step(
            loss, len(y), {"loss": loss.item() * len(y), "n": len(y), "correct": int((logits.argmax(-1) == y).sum())}
        )

    def epoch_message(self, epoch: int, event: dict) -> str:
        return (
            f"epoch {epoch + 1}: train loss {event['train_loss']:.4f} acc {event['train_accuracy']:.4f} | val acc "
            f"{event['val_accuracy']:.4f}{' *' if event['best'] else ''} | {event['minutes']:.1f} min"
        )


def finish(path: Path, config: VisionTrainConfig, splits: Splits, *, minutes: float, best_epoch: int) -> dict:
    run = load_vision_run(path)
    test = evaluate_images(run.model, *splits.test)
    val = evaluate_images(run.model, *splits.validation)
    baseline = pixel_baseline(splits) if config.run.baseline else None
    results = {
        "task": "image classification",
        "dataset": config.data.name,
        "test": {k: test[k] for k in ("accuracy", "macro_f1", "per_class_f1", "loss", "n", "confusion")},
        "validation": {k: val[k] for k in ("accuracy", "macro_f1", "loss", "n")},
        "best_epoch": best_epoch,
        "train_minutes": minutes,
        "threads": config.run.threads,
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "model": {
            "stem": config.model.stem,
            "patch_size": config.model.patch_size,
            "tokens": config.model.num_patches + config.model.patch_offset,
        },
        "images": {"train": len(splits.train[1]), "validation": len(splits.validation[1]), "test": len(splits.test[1])},
        "labels": splits.label_names,
        "baseline_pixels_logreg": baseline,
    }
    atomic_write_json(path / "results.json", results)
    plot_confusion(
        test["confusion"],
        splits.label_names,
        path / "confusion.png",
        f"{config.data.name} test: accuracy {test['accuracy']:.3f}",
    )
    plot_curves(path)
    if config.run.progress:
        extra = f"; pixel logistic regression {baseline['accuracy']:.4f}" if baseline else ""
        print(f"test accuracy {test['accuracy']:.4f} ({test['n']} images){extra}; {minutes:.1f} min of training")
    return results


def plot_curves(path: Path) -> None:
    """The image task's accuracies against training minutes (``curves.png``/``.svg``)."""
    from ..plotting import Line, Panel, plot_curves as draw

    lines = (Line("train_accuracy", "train (augmented)"), Line("val_accuracy", "validation", style="s-"))
    draw(path / "metrics.jsonl", path / "curves", (Panel("minutes", lines, "training minutes", "accuracy"),))


# ---------------------------------------------------------------------------------------------------- loading
@dataclass
class VisionRunFolder:
    path: Path
    config: VisionTrainConfig
    labels: list[str]
    model: VisionTransformer


def is_vision_run(path: str | Path) -> bool:
    return is_task_run(path, "vision")


def load_vision_run(path: str | Path, device: str = "cpu") -> VisionRunFolder:
    """Rebuild a ViT from its run folder (config validated, shapes checked against the weights' header)."""
    path = Path(path)
    config = read_task_config(path, "vision", VisionTrainConfig)
    labels = read_json(path / "labels.json", list)
    return VisionRunFolder(path, config, labels, load_task_weights(path, config, VisionTransformer).to(device))


def _wrong_size(path: Path, shape: tuple, want: tuple) -> I.ImageDataError:
    return I.ImageDataError(f"{path} is {tuple(shape)}; the model takes {want} (C, H, W) images: resize it first")


def _read_npy(path: Path, want: tuple):
    """A ``.npy`` array, its header (shape, dtype) checked before the payload is read; never a pickle."""
    import numpy as np

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
        if dtype.hasobject or dtype.kind not in "uif":
            raise I.ImageDataError(
                f"{path} could not be read as an image: it holds {dtype} values; an image is "
                "numbers (uint8 0..255 or floats)"
            )
        if tuple(shape) not in (want, want[1:]) or (len(shape) == 2 and want[0] != 1):
            raise _wrong_size(path, shape, want)
        f.seek(0)
        return np.lib.format.read_array(f, allow_pickle=False)


def _read_png(path: Path, want: tuple, channels: int):
    """A PNG through Pillow: its declared size checked against the model's before the pixels are decoded (and
    Pillow's decompression-bomb limit); values scaled as 8-bit (or 16-bit) to 0..255."""
    import numpy as np
    from PIL import Image

    try:
        im = Image.open(path)
    except Image.DecompressionBombError as exc:  # its header declares more pixels than Pillow's limit
        raise I.ImageDataError(f"{path} declares too many pixels to decode ({exc})") from None
    with im:
        w, h = im.size  # from the header: nothing decoded yet
        if (h, w) != want[1:]:
            raise _wrong_size(path, (channels, h, w), want)
        if im.mode not in ("L", "RGB", "RGBA", "I;16", "I;16B"):
            im = im.convert("RGBA")
        top = 65535.0 if im.mode.startswith("I;16") else 255.0
        a = np.asarray(im, dtype=np.float64) / top  # in [0, 1], as matplotlib reads PNG
    a = a[..., :3].mean(-1) if a.ndim == 3 and channels == 1 else a[..., :3] if a.ndim == 3 else a
    a = np.rint(a * 255)
    return a.transpose(2, 0, 1) if a.ndim == 3 else a


def read_image(path: str | Path, config: VisionConfig) -> torch.Tensor:
    """One image from a ``.png`` (via matplotlib) or ``.npy`` (``allow_pickle=False``) file as uint8
    ``(1, C, H, W)``, checked against the model's size (no resizing: a wrong size is an error that says so)."""
    import numpy as np

    path = Path(path)
    want = (config.channels, config.image_size, config.image_size)
    try:
        if path.suffix.lower() == ".npy":
            a = _read_npy(path, want)
        elif path.suffix.lower() == ".png":
            a = _read_png(path, want, config.channels)
        else:
            raise ValueError(f"{path}: give a .png or .npy image")
    except I.ImageDataError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise I.ImageDataError(f"{path} could not be read as an image ({exc})") from None
    a = np.asarray(a)
    if a.ndim == 2:
        a = a[None]
    if tuple(a.shape) != want:
        raise I.ImageDataError(f"{path} is {tuple(a.shape)}; the model takes {want} (C, H, W) images: resize it first")
    if a.dtype != np.uint8:
        if not np.isfinite(a).all() or a.min() < 0 or a.max() > 255:
            raise I.ImageDataError(f"{path}: pixel values must be finite and in [0, 255]")
        a = np.rint(a).astype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(a))[None]


def held_out_images(run: VisionRunFolder) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's test split (images, labels)."""
    return I.load_images(run.config.data.name, path=run.config.data.path, seed=run.config.data.split_seed).test


__all__ = [
    "VisionTrainConfig",
    "config_from_overrides",
    "evaluate_images",
    "is_vision_run",
    "load_vision_run",
    "pixel_baseline",
    "predict_images",
    "read_image",
    "train_vision",
]
