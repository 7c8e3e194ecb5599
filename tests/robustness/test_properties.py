"""Property-based tests (hypothesis): the mask converters, the data readers and the attention entry point, on random
shapes, masks, dtypes and texts, against formulas written here."""

from __future__ import annotations

import csv
import json
import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.attention import masks as M
from multihead.data import DataError
from multihead.data.datasets import _read_user_file

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def bool_tensors(shape):
    n = math.prod(shape)
    return st.lists(st.booleans(), min_size=n, max_size=n).map(lambda xs: torch.tensor(xs).reshape(shape))


# ---------------------------------------------------------------------------------------------------- masks
@FAST
@given(st.integers(1, 4), st.integers(1, 9), st.data())
def test_torch_key_padding_converts_to_its_negation(b, lk, data):
    torch_style = data.draw(bool_tensors((b, lk)))  # True = padding
    ours = M.from_torch_key_padding_mask(torch_style)
    assert ours.shape == (b, 1, 1, lk) and torch.equal(ours[:, 0, 0], ~torch_style)


@FAST
@given(st.integers(1, 4), st.integers(1, 9), st.data())
def test_hf_attention_mask_converts_to_bool(b, lk, data):
    hf = data.draw(bool_tensors((b, lk))).long()  # 1 = attend
    assert torch.equal(M.from_hf_attention_mask(hf)[:, 0, 0], hf == 1)


@FAST
@given(st.integers(0, 12), st.integers(0, 12))
def test_causal_mask_is_bottom_right_aligned(lq, lk):
    m = M.causal_mask(lq, lk)
    for i in range(lq):
        for j in range(lk):
            assert bool(m[i, j]) == (j <= i + lk - lq)


@FAST
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_merged_masks_forbid_what_either_forbids(lq, lk, data):
    a = data.draw(bool_tensors((lq, lk)))
    b = data.draw(bool_tensors((lq, lk)))
    float_b = torch.zeros(lq, lk).masked_fill(~b, float("-inf"))
    for x, y in ((a, b), (a, float_b), (float_b, a)):
        merged = M.merge_masks(x, y)
        assert torch.equal(M.is_masked(merged), ~a | ~b)


@FAST
@given(st.lists(st.integers(0, 9), min_size=1, max_size=5))
def test_key_padding_from_lengths(lengths):
    m = M.key_padding_mask(lengths, max_len=9)
    for row, n in enumerate(lengths):
        assert m[row, 0, 0].tolist() == [j < n for j in range(9)]


# ---------------------------------------------------------------------------------------------------- attention
@st.composite
def attention_calls(draw):
    b, g = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = g * draw(st.integers(1, 2))
    lq, lk, d = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 8))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen, dtype=dtype)
    k, v = (torch.randn(b, g, lk, d, generator=gen, dtype=dtype) for _ in range(2))
    mask = draw(st.none() | bool_tensors((b, 1, lq, lk)))
    causal = draw(st.booleans())
    return q, k, v, mask, causal


@settings(max_examples=250, deadline=None)
@given(attention_calls(), st.sampled_from(["reference", "sdpa", "memory_efficient", "auto"]))
def test_attention_equals_the_fp64_formula(call, backend):
    q, k, v, mask, causal = call
    out, w = mh.attention(q, k, v, mask=mask, is_causal=causal, backend=backend, need_weights=backend == "reference")
    allowed = torch.ones(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        allowed = allowed & M.causal_mask(q.shape[2], k.shape[2])
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = (q.double() @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    weights = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)  # empty rows: zero
    tol = 1e-5 if q.dtype == torch.float32 else 1e-10
    assert torch.isfinite(out).all()
    assert (out.double() - weights @ vv).abs().max() < tol
    if w is not None:
        assert (w.double() - weights).abs().max() < tol


# ---------------------------------------------------------------------------------------------------- data readers
texts = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r"), min_size=1, max_size=40
).filter(lambda t: t.strip())
labels = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r"), min_size=1, max_size=8
).filter(lambda t: t.strip())


@FAST
@given(st.lists(st.tuples(texts, labels), min_size=1, max_size=12), st.sampled_from([".csv", ".tsv", ".jsonl"]))
def test_readers_return_exactly_what_was_written(tmp_path_factory, rows, suffix):
    path = tmp_path_factory.mktemp("prop") / f"data{suffix}"
    with path.open("w", encoding="utf-8", newline="") as f:
        if suffix == ".jsonl":
            for t, y in rows:
                f.write(json.dumps({"text": t, "label": y}) + "\n")
        else:
            w = csv.writer(f, delimiter="\t" if suffix == ".tsv" else ",")
            w.writerow(["text", "label"])
            w.writerows(rows)
    got_t, got_y = _read_user_file(path, "text", "label")
    assert got_t == [t for t, _ in rows] and got_y == [y for _, y in rows]


@FAST
@given(st.binary(min_size=1, max_size=200))
def test_readers_never_crash_on_arbitrary_bytes(tmp_path_factory, raw):
    for suffix in (".csv", ".jsonl"):
        path = tmp_path_factory.mktemp("bytes") / f"data{suffix}"
        path.write_bytes(b"text,label\n" + raw if suffix == ".csv" else raw)
        try:
            _read_user_file(path, "text", "label")
        except DataError as exc:
            assert str(path) in str(exc) or "column" in str(exc)
