"""Image-classification data that installs offline: Fashion-MNIST (Debian's ``dataset-fashion-mnist``, IDX files)
and scikit-learn's ``load_digits`` (always available; the tests use it).

* **Fashion-MNIST** (Xiao et al. 2017): 60,000 training and 10,000 test images, 28x28 grey, 10 classes. Debian
  installs ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` under ``/usr/share/datasets/fashion-mnist``; another
  folder is named with ``--set data.path=DIR`` or ``MULTIHEAD_FASHION_MNIST``. The files are read with :func:`read_idx` (a
  few lines of numpy; the header's sizes are checked against the ceilings and the file before anything is allocated).
* **digits**: 1,797 8x8 images (values 0..16, scaled to 0..255), 10 classes.

Splits are fixed and recorded in every run folder: Fashion-MNIST keeps its official test set and holds out a seeded
5,000 of the training images for validation; digits is split 80/10/10, seeded and stratified.
"""

from __future__ import annotations

import gzip
import os
import random
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .datasets import DataError
from .splits import Splits

FASHION_LABELS = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
IMAGE_DATASETS = {
    "fashion_mnist": "Fashion-MNIST (Debian's dataset-fashion-mnist): 60k/10k 28x28 grey images, 10 classes",
    "digits": "scikit-learn's digits: 1,797 8x8 grey images, 10 classes",
}
IMAGE_SHAPES = {"fashion_mnist": (1, 28, 28), "digits": (1, 8, 8)}  # (C, H, W), known before anything is read
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_ENV = "MULTIHEAD_FASHION_MNIST"
INSTALL = "apt-get install dataset-fashion-mnist (as root; .ci/run does it)"
_IDX_TYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
MAX_IDX_BYTES = 1 << 30  # 1 GiB: Fashion-MNIST's largest file holds 47 MB


class ImageDataError(DataError):
    """Missing or malformed image data; the message says how to fix it."""


def read_idx(path: str | Path, *, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """An IDX file (LeCun's MNIST format; ``.gz`` or plain) as a numpy array. The header -- two zero bytes, a type
    code, the number of dimensions, then each size as a big-endian int32 -- is checked against the file and
    ``max_bytes`` before the data are read."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_TYPES or head[3] == 0:
                raise ImageDataError(
                    f"{path} is not an IDX file (bad magic {head.hex() or 'empty'}); expected the "
                    "MNIST format: 00 00 <type> <ndim>"
                )
            dtype, ndim = np.dtype(_IDX_TYPES[head[2]]), head[3]
            raw_dims = f.read(4 * ndim)
            if len(raw_dims) < 4 * ndim:
                raise ImageDataError(f"{path}: the IDX header is truncated ({ndim} sizes announced)")
            dims = [int.from_bytes(raw_dims[4 * i : 4 * i + 4], "big") for i in range(ndim)]
            count = int(np.prod(dims, dtype=np.int64)) if dims else 0
            nbytes = count * dtype.itemsize
            if nbytes > max_bytes:
                raise ImageDataError(
                    f"{path}: the header announces {dims} ({nbytes:,} bytes), over the "
                    f"{max_bytes:,}-byte limit; the file is corrupt or not image data"
                )
            data = f.read(nbytes + 1)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:  # a corrupt gzip stream raises zlib.error
        raise ImageDataError(f"{path} could not be read ({exc}); reinstall the data: {INSTALL}") from None
    if len(data) != nbytes:
        what = "is truncated" if len(data) < nbytes else "has data after the announced end"
        raise ImageDataError(
            f"{path} {what}: the header announces {dims} ({nbytes:,} bytes), the file holds "
            f"{min(len(data), nbytes + 1):,}{'+' if len(data) > nbytes else ''}; reinstall it"
        )
    return np.frombuffer(bytearray(data), dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="), copy=False)


class ImageSet(NamedTuple):
    """One part of an image split: uint8 images ``(N, C, H, W)`` and int64 labels ``(N,)`` (a pair: ``images, labels =
    part``), a part of the one :class:`~multihead.data.splits.Splits` type."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:  # items, not the pair's two fields
        return int(self.labels.shape[0])

    def subset(self, indices: list[int]) -> ImageSet:
        idx = torch.tensor(indices, dtype=torch.long)
        return ImageSet(self.images[idx], self.labels[idx])

    def label_ids(self) -> list[int]:
        return self.labels.tolist()

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of every image."""
        return tuple(self.images.shape[1:])


def fashion_dir(path: str | Path | None = None) -> Path:
    """The folder holding Fashion-MNIST's IDX files: ``path``, else ``$MULTIHEAD_FASHION_MNIST``, else Debian's."""
    folder = Path(path or os.environ.get(FASHION_ENV) or FASHION_DIR)
    names = [f"{s}-{k}-ubyte.gz" for s in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]
    missing = [n for n in names if not (folder / n).is_file() and not (folder / n[:-3]).is_file()]
    if missing:
        raise ImageDataError(
            f"Fashion-MNIST is not installed at {folder} (missing {', '.join(missing)}): "
            f"{INSTALL}, or point --set data.path=DIR (or {FASHION_ENV}) at a folder holding the IDX files"
        )
    return folder


def _idx(folder: Path, name: str) -> np.ndarray:
    return read_idx(folder / name if (folder / name).is_file() else folder / name[:-3])


def _fashion(path=None, *, seed: int = 0, validation: int = 5000) -> Splits:
    folder = fashion_dir(path)
    x_train, y_train = _idx(folder, "train-images-idx3-ubyte.gz"), _idx(folder, "train-labels-idx1-ubyte.gz")
    x_test, y_test = _idx(folder, "t10k-images-idx3-ubyte.gz"), _idx(folder, "t10k-labels-idx1-ubyte.gz")
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8:
            raise ImageDataError(
                f"{folder}: the {split} files hold images {x.shape} {x.dtype} and labels {y.shape}; "
                "expected (N, 28, 28) uint8 images and N labels"
            )
        if y.size and (int(y.max()) >= len(FASHION_LABELS) or int(y.min()) < 0):
            raise ImageDataError(
                f"{folder}: {split} labels run {int(y.min())}..{int(y.max())}; Fashion-MNIST's are "
                "0..9: the files are corrupt or not Fashion-MNIST (reinstall them)"
            )
    if len(x_train) <= validation:  # the hold-out must leave images to train on
        raise ImageDataError(
            f"{folder}: the training files hold {len(x_train):,} images, not more than the "
            f"{validation:,} held out for validation; Fashion-MNIST's hold 60,000: reinstall them"
        )
    order = list(range(len(x_train)))
    random.Random(seed).shuffle(order)
    val_idx, train_idx = sorted(order[:validation]), sorted(order[validation:])
    images = torch.from_numpy(np.ascontiguousarray(x_train)).unsqueeze(1)  # (N, 1, 28, 28)
    labels = torch.from_numpy(y_train.astype(np.int64))
    test = (torch.from_numpy(np.ascontiguousarray(x_test)).unsqueeze(1), torch.from_numpy(y_test.astype(np.int64)))
    record = {
        "dataset": "fashion_mnist",
        "folder": str(folder),
        "seed": seed,
        "validation": val_idx,
        "test": "official t10k",
    }
    return Splits(
        ImageSet(images[train_idx], labels[train_idx]),
        ImageSet(images[val_idx], labels[val_idx]),
        ImageSet(*test),
        record,
        "fashion_mnist",
        list(FASHION_LABELS),
    )


def _digits(*, seed: int = 0) -> Splits:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.from_numpy(np.rint(d.images * (255 / 16)).astype(np.uint8)).unsqueeze(1)  # (1797, 1, 8, 8)
    labels = torch.from_numpy(d.target.astype(np.int64))
    rng = random.Random(seed)
    parts = {"train": [], "validation": [], "test": []}
    for c in range(10):  # stratified 80/10/10
        idx = [i for i in range(len(labels)) if int(labels[i]) == c]
        rng.shuffle(idx)
        n_val = n_test = round(len(idx) * 0.1)
        parts["validation"] += idx[:n_val]
        parts["test"] += idx[n_val : n_val + n_test]
        parts["train"] += idx[n_val + n_test :]
    sel = {k: sorted(v) for k, v in parts.items()}
    record = {"dataset": "digits", "seed": seed, **{k: v for k, v in sel.items() if k != "train"}}
    return Splits(
        *(ImageSet(images[v], labels[v]) for v in sel.values()), record, "digits", [str(i) for i in range(10)]
    )


def load_images(name: str, *, path: str | Path | None = None, seed: int = 0) -> Splits:
    """The fixed splits of a built-in image dataset (:data:`IMAGE_DATASETS`): a :class:`Splits` of :class:`ImageSet`
    parts, with the class names."""
    if name == "fashion_mnist":
        return _fashion(path, seed=seed)
    if name == "digits":
        return _digits(seed=seed)
    raise ImageDataError(f"unknown image dataset {name!r}; choose one of {', '.join(IMAGE_DATASETS)}")


def is_image_dataset(name: str) -> bool:
    return name in IMAGE_DATASETS


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, C, H, W)`` -> float in [-1, 1] (what the models take)."""
    return images.float().div_(127.5).sub_(1.0)


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Light augmentation: each image shifted by up to ``pad`` pixels in x and y (zero-padded, then cropped back),
    seeded by ``generator``. ``(B, C, H, W)`` in, same shape out."""
    if pad <= 0:
        return images
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator).tolist()
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator).tolist()
    return torch.stack([padded[i, :, y : y + h, x : x + w] for i, (y, x) in enumerate(zip(dy, dx))])


__all__ = [
    "FASHION_LABELS",
    "IMAGE_DATASETS",
    "IMAGE_SHAPES",
    "ImageDataError",
    "ImageSet",
    "fashion_dir",
    "is_image_dataset",
    "load_images",
    "random_shift",
    "read_idx",
    "to_float",
]
