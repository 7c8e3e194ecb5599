"""The Vision Transformer on our encoder blocks: patch shapes, errors, pruning, capture, attention distance, IDX."""

import gzip
import json

import numpy as np
import pytest
import torch

from multihead.data import images as I
from multihead.interpret import capture
from multihead.models.vision import (
    VisionConfig,
    VisionTransformer,
    mean_attention_distance,
    sincos_2d,
)
from multihead.modules.encoder import EncoderConfig


def _vit(**kw):
    enc = EncoderConfig(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0, norm_first=True)
    return VisionTransformer(VisionConfig(**{"image_size": 8, "patch_size": 2, "encoder": enc, **kw})).eval()


@pytest.mark.parametrize(
    "image_size,patch,channels,stem",
    [(8, 2, 1, "patch"), (8, 4, 1, "conv"), (28, 4, 1, "patch"), (28, 7, 3, "conv"), (12, 1, 2, "patch")],
)
def test_patch_embedding_shapes(image_size, patch, channels, stem):
    for pooling in ("cls", "mean"):
        m = _vit(image_size=image_size, patch_size=patch, channels=channels, stem=stem, pooling=pooling)
        x = torch.randn(3, channels, image_size, image_size)
        n = (image_size // patch) ** 2
        assert m.patch_embed(x).shape == (3, n, 32)
        assert m.features(x).shape == (3, n + (pooling == "cls"), 32)
        assert m(x).shape == (3, 10)


def test_patch_size_must_tile_the_image_and_inputs_are_checked():
    with pytest.raises(ValueError, match=r"not divisible by patch_size=3.*choose patch_size from \[1, 2, 4, 8\]"):
        _vit(image_size=8, patch_size=3)
    m = _vit()
    with pytest.raises(ValueError, match="add a batch axis"):
        m(torch.randn(1, 8, 8))
    with pytest.raises(ValueError, match=r"\(B, 1, 8, 8\)"):
        m(torch.randn(2, 1, 9, 9))
    with pytest.raises(TypeError, match="must be float"):
        m(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="rotary"):
        VisionConfig(encoder=EncoderConfig(d_model=32, num_heads=4, rotary=True))


def test_config_round_trips_and_sincos_positions_are_2d():
    c = VisionConfig(stem="conv", positional="sincos", pooling="mean")
    assert VisionConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    table = sincos_2d(4, 16)  # (16, 16): first half encodes the row, second the column
    rows = table.view(4, 4, 16)
    assert torch.allclose(rows[:, 0, :8], rows[:, 3, :8]) and not torch.allclose(rows[0, :, :8], rows[3, :, :8])
    assert torch.allclose(rows[0, :, 8:], rows[3, :, 8:]) and not torch.allclose(rows[:, 0, 8:], rows[:, 3, 8:])


def test_pruned_heads_equal_masked_heads_on_a_vit():
    torch.manual_seed(0)
    m = _vit(stem="conv")
    x = torch.randn(4, 1, 8, 8)
    mask = torch.ones(2, 4)
    mask[0, 1] = mask[1, 0] = mask[1, 3] = 0
    with torch.no_grad():
        masked = m(x, head_mask=mask)
        m.encoder.prune_heads({0: [1], 1: [0, 3]})
        pruned = m(x)
    assert m.encoder.num_heads == [3, 2]
    assert torch.allclose(masked, pruned, atol=1e-5)


def test_capture_on_a_vit_and_mean_attention_distance_against_the_formula():
    m = _vit(patch_size=4)  # 2x2 patches + [CLS]: 5 tokens
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad(), capture(m, ("pattern",)) as cache:
        logits = m(x)
    pats = cache.patterns()
    assert len(pats) == 2 and pats[0].shape == (2, 4, 5, 5)
    assert torch.allclose(pats[0].sum(-1), torch.ones(2, 4, 5), atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(m(x), logits, atol=1e-5)  # capturing changes nothing
    # planted: head 0 looks at itself (distance 0), head 1 at the diagonal opposite patch (4 * sqrt(2) pixels)
    p = torch.zeros(1, 4, 5, 5)
    p[:, :, :, 0] = 1.0  # [CLS] column: left out and the rows renormalised over the patches
    for q in range(4):
        p[0, 0, 1 + q, 1 + q] = 1.0
        p[0, 1, 1 + q, 1 + (3 - q)] = 1.0
        p[0, 2, 1 + q, 1:] = 0.25  # uniform over the 4 patches
        p[0, 3, 1 + q, 1 + (q ^ 1)] = 1.0  # the horizontal neighbour: 4 pixels
    d = mean_attention_distance([p], m)[0]
    uniform = (0 + 4 + 4 + 4 * 2**0.5) / 4
    assert torch.allclose(d, torch.tensor([0.0, 4 * 2**0.5, uniform, 4.0]), atol=1e-5)


def _write_idx(path, array, *, gz=True, code=0x08):
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def test_idx_reader_on_files_the_test_writes(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "x.gz", a)
    _write_idx(tmp_path / "x", a, gz=False)
    assert np.array_equal(I.read_idx(tmp_path / "x.gz"), a) and np.array_equal(I.read_idx(tmp_path / "x"), a)
    b = np.array([1, -2, 300], dtype=np.int32)
    _write_idx(tmp_path / "i.gz", b, code=0x0C)
    assert I.read_idx(tmp_path / "i.gz").tolist() == [1, -2, 300]
    (tmp_path / "bad").write_bytes(b"\x89PNG....")
    with pytest.raises(I.ImageDataError, match="not an IDX file"):
        I.read_idx(tmp_path / "bad")
    raw = (tmp_path / "x").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-5])
    with pytest.raises(I.ImageDataError, match="truncated"):
        I.read_idx(tmp_path / "short")
    (tmp_path / "huge").write_bytes(bytes([0, 0, 8, 3]) + (60000).to_bytes(4, "big") * 3)  # 2e14 bytes announced
    with pytest.raises(I.ImageDataError, match="over the"):
        I.read_idx(tmp_path / "huge")


def test_missing_fashion_mnist_names_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv(I.FASHION_ENV, raising=False)
    with pytest.raises(I.ImageDataError, match="apt-get install dataset-fashion-mnist.*data.path"):
        I.load_images("fashion_mnist", path=tmp_path)
    with pytest.raises(I.ImageDataError, match="unknown image dataset"):
        I.load_images("cifar10")


def test_fashion_mnist_from_a_folder_of_idx_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    for split, n in (("train", 60), ("t10k", 20)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n, dtype=np.uint8))
    monkeypatch.setenv(I.FASHION_ENV, str(tmp_path))
    s = I._fashion(validation=10)
    assert (
        s.train.image_shape == (1, 28, 28)
        and len(s.train[1]) == 50
        and len(s.validation[1]) == 10
        and len(s.test[1]) == 20
    )
    assert s.label_names[7] == "Sneaker" and s.train[0].dtype == torch.uint8


def test_digits_splits_are_fixed_and_stratified():
    a, b = I.load_images("digits"), I.load_images("digits")
    assert torch.equal(a.test[0], b.test[0]) and a.train.image_shape == (1, 8, 8)
    assert len(a.train[1]) + len(a.validation[1]) + len(a.test[1]) == 1797
    assert torch.bincount(a.test[1], minlength=10).min() >= 15  # every class in the test split
    assert int(a.train[0].max()) == 255


def test_random_shift_is_seeded_and_keeps_the_pixels():
    x = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    x[:, :, 3:5, 3:5] = 200
    s1 = I.random_shift(x, 2, torch.Generator().manual_seed(1))
    s2 = I.random_shift(x, 2, torch.Generator().manual_seed(1))
    assert torch.equal(s1, s2) and s1.shape == x.shape
    assert (s1.flatten(1).sum(1) == x.flatten(1).sum(1)).all()  # a 2-pixel shift of a central blob loses nothing
    assert torch.equal(I.random_shift(x, 0, torch.Generator()), x)
