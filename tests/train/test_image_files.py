"""Image files are checked from their headers before their payload is read: a PNG or .npy that declares a huge size
costs nothing (before: decoded or allocated first, then compared), and Fashion-MNIST IDX files with too few images,
negative labels or a corrupt gzip stream are refused with the fix (before: exit 70 at the first step or on reading)."""

import gzip
import struct
import zlib

import numpy as np
import pytest

from multihead.data import images as I
from multihead.models.vision import VisionConfig
from multihead.train.vision import read_image

CONFIG = VisionConfig(image_size=8, channels=1, patch_size=2, num_classes=10)


def _png_header(path, width, height):
    """A PNG with only its IHDR chunk (no pixel data): what a reader sees before decoding anything."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))


def test_a_png_declaring_a_huge_size_is_refused_from_its_header(tmp_path):
    _png_header(tmp_path / "big.png", 100000, 100000)
    with pytest.raises(I.ImageDataError, match="too many pixels|the model takes"):
        read_image(tmp_path / "big.png", CONFIG)
    _png_header(tmp_path / "wide.png", 5000, 8)
    with pytest.raises(I.ImageDataError, match=r"\(1, 8, 5000\); the model takes \(1, 8, 8\)"):
        read_image(tmp_path / "wide.png", CONFIG)


def test_a_npy_declaring_a_huge_shape_is_refused_from_its_header(tmp_path):
    path = tmp_path / "big.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": (1_000_000, 1_000_000)}
        )
    with pytest.raises(I.ImageDataError, match=r"\(1000000, 1000000\); the model takes"):
        read_image(path, CONFIG)
    np.save(tmp_path / "obj.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    with pytest.raises(I.ImageDataError, match="holds object values"):
        read_image(tmp_path / "obj.npy", CONFIG)


def test_png_and_npy_images_read_as_before(tmp_path):
    from PIL import Image

    pixels = (np.arange(64).reshape(8, 8) * 4).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "g.png")
    np.save(tmp_path / "g.npy", pixels)
    assert (read_image(tmp_path / "g.png", CONFIG)[0, 0].numpy() == pixels).all()
    assert (read_image(tmp_path / "g.npy", CONFIG)[0, 0].numpy() == pixels).all()
    rgb = np.stack([pixels, pixels // 2, pixels // 4], -1)
    Image.fromarray(rgb).save(tmp_path / "c.png")
    want = np.rint((rgb / 255.0).mean(-1) * 255)
    assert (read_image(tmp_path / "c.png", CONFIG)[0, 0].numpy() == want).all()  # grey: the mean of R, G, B


def _idx(path, array, type_code=0x08):
    dims = b"".join(struct.pack(">I", n) for n in array.shape)
    payload = bytes([0, 0, type_code, array.ndim]) + dims + array.tobytes()
    with gzip.open(path, "wb") as f:
        f.write(payload)


def _fashion(folder, n_train=20, labels=None):
    folder.mkdir()
    _idx(folder / "train-images-idx3-ubyte.gz", np.zeros((n_train, 28, 28), np.uint8))
    _idx(
        folder / "train-labels-idx1-ubyte.gz",
        np.zeros(n_train, np.uint8) if labels is None else labels,
        0x08 if labels is None else 0x09,
    )
    _idx(folder / "t10k-images-idx3-ubyte.gz", np.zeros((5, 28, 28), np.uint8))
    _idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(5, np.uint8))
    return folder


def test_fashion_files_with_fewer_images_than_the_hold_out_are_refused(tmp_path):
    folder = _fashion(tmp_path / "f", n_train=20)
    with pytest.raises(I.ImageDataError, match="not more than the 5,000 held out"):
        I.load_images("fashion_mnist", path=folder)


def test_fashion_labels_below_zero_are_refused(tmp_path):
    folder = _fashion(tmp_path / "f", n_train=6000, labels=np.full(6000, -1, np.int8))
    with pytest.raises(I.ImageDataError, match=r"labels run -1\.\.-1"):
        I.load_images("fashion_mnist", path=folder)


def test_a_corrupt_gzip_stream_is_refused(tmp_path):
    folder = _fashion(tmp_path / "f", n_train=20)
    raw = bytearray((folder / "train-images-idx3-ubyte.gz").read_bytes())
    raw[30:60] = b"\xff" * 30  # inside the deflate stream
    (folder / "train-images-idx3-ubyte.gz").write_bytes(bytes(raw))
    with pytest.raises(I.ImageDataError, match="could not be read"):
        I.load_images("fashion_mnist", path=folder)
