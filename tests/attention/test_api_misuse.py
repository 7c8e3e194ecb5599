"""The Python API answers misuse with a ValueError/TypeError that names the fix (before: IndexError, RuntimeError or
AttributeError from deep inside), NaN inputs give the same answer on every backend, and every capability a backend
declares holds (a call it claims to run, runs)."""

import math

import numpy as np
import pytest
import torch

import multihead as mh
from multihead.attention.registry import list_backends

EXACT = ["auto", "sdpa", "reference", "memory_efficient"]


def _qkv():
    torch.manual_seed(0)
    return torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)


@pytest.mark.parametrize("backend", EXACT)
def test_a_nan_query_row_is_nan_on_every_backend(backend):
    """Before: zeros on auto/sdpa (PyTorch's CPU kernel), NaN on reference/memory_efficient."""
    q, k, v = _qkv()
    q[0, 0, 1, 3] = math.nan
    out = mh.attention(q, k, v, backend=backend)[0]
    assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, [0, 2, 3]]).any()
    assert not torch.isnan(out[0, 1]).any()
    masked = mh.attention(
        q, k, v, backend=backend, mask=torch.tensor([[True] * 4, [False] * 4, [True] * 4, [True] * 4])
    )[0]
    assert (masked[0, 0, 1] == 0).all()  # a row with no key is zero, NaN query or not (the reference formula's)


@pytest.mark.parametrize("backend", EXACT)
def test_a_non_finite_scale_is_refused(backend):
    q, k, v = _qkv()
    for scale in (math.nan, math.inf):
        with pytest.raises(ValueError, match="scale must be a finite number"):
            mh.attention(q, k, v, backend=backend, scale=scale)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda q, k, v: mh.attention(q, k, v, mask=torch.ones(4, dtype=torch.bool)), ValueError, "fewer than 2 dims"),
        (lambda q, k, v: mh.attention(q, k, v, mask=torch.tensor(True)), ValueError, "key_padding_mask="),
        (lambda q, k, v: mh.attention(q.long(), k.long(), v.long()), TypeError, "floating point"),
        (lambda q, k, v: mh.attention(q.numpy(), k, v), TypeError, "torch.from_numpy"),
        (lambda q, k, v: mh.attention(q, k.to("meta"), v.to("meta")), ValueError, "different devices"),
        (lambda q, k, v: mh.MultiHeadAttention(8, 2)(np.zeros((1, 3, 8), np.float32)), TypeError, "torch.Tensor"),
        (
            lambda q, k, v: mh.MultiHeadAttention(8, 2)(torch.zeros(1, 3, 8, dtype=torch.long)),
            TypeError,
            "embed token ids first",
        ),
        (
            lambda q, k, v: mh.MultiHeadAttention(8, 2)(torch.zeros(1, 3, 8), key_padding_mask=np.ones((1, 3), bool)),
            TypeError,
            "torch.as_tensor",
        ),
    ],
)
def test_misuse_names_the_fix(call, error, message):
    with pytest.raises(error, match=message):
        call(*_qkv())


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("name", [n for n in list_backends() if n != "flex"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_declared_dtype_runs(name, dtype):
    """A backend that declares a dtype on CPU runs a call in it (or declines it with a reason, never fails after)."""
    backend = list_backends()[name]
    if dtype not in backend.capabilities.dtypes or backend.available() is not None:
        pytest.skip(f"{name} does not declare {dtype}")
    q, k, v = (t.to(dtype) for t in _qkv())
    from multihead.attention.patterns import SparsePattern

    pattern = None
    if backend.capabilities.requires_pattern:
        pattern = SparsePattern(window=2) if "window" in backend.capabilities.patterns else SparsePattern(block=2)
    q, k, v = (torch.cat([t] * 4, 2) for t in (q, k, v)) if pattern is not None else (q, k, v)
    reason = dict(mh.explain(q, k, mask=pattern)).get(name)
    if reason is not None:
        pytest.skip(f"{name} declines: {reason}")
    out = mh.attention(q, k, v, mask=pattern, backend=name)[0]
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_flex_declines_float64_on_cpu_with_the_reason():
    """Before: declared, then failed after 11 s of compiling with a raw inductor error."""
    if list_backends()["flex"].available() is not None:
        pytest.skip(list_backends()["flex"].available())
    q = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    assert "float64" in dict(mh.explain(q, q))["flex"]
    with pytest.raises(ValueError, match="does not run float64 on CPU"):
        mh.attention(q, q, q, backend="flex")
