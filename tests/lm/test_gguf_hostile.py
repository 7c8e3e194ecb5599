"""Hostile GGUF files: a broken layout (tensors overlapping, unaligned, past the end, wrapped around 2^64, of a type
that does not match their bytes or their role), metadata of the wrong type or of absurd sizes, tokenizer fields that
do not make a vocabulary, and random byte flips and truncations. Each is refused with a message naming the file and
the fix (never a traceback, a hang or a model that loads wrong); where the ``gguf`` package alone accepts the file,
the test says so, which is why the layout is checked first."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
import torch

from gguf_edits import insert_entry, nested_array, patch_offset, rewrite
from hf_families import hf_model, write_gguf
from multihead import lm
from multihead.cli import main
from multihead.lm import LMError
from multihead.pretrained.formats.gguf_layout import scan

V, Q = gguf.GGUFValueType, gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_gguf(hf_model("llama", rope_scaling=None), tmp_path_factory.mktemp("g") / "base.gguf")


@pytest.fixture(scope="module")
def logits(base):
    ids = torch.arange(5, 45).reshape(1, 40)
    with torch.no_grad():
        return ids, lm.load(base).model(ids)


def refused(path, *fragments):
    with pytest.raises(LMError) as info:
        lm.load(path)
    message = str(info.value)
    assert str(path) in message, message
    for f in fragments:
        assert f in message, (f, message)
    return message


# ---------------------------------------------------------------------------------------------------- the layout
def test_overlapping_tensors_are_refused(base, tmp_path):
    first, second = scan(base).tensors[:2]
    bad = patch_offset(base, tmp_path / "overlap.gguf", second.name, first.offset)
    gguf.GGUFReader(bad)  # the gguf package alone reads it: both tensors see the same bytes
    refused(bad, "inside the tensor before it")


def test_unaligned_tensor_is_refused(base, tmp_path):
    t = scan(base).tensors[3]
    bad = patch_offset(base, tmp_path / "unaligned.gguf", t.name, t.offset + 4)
    gguf.GGUFReader(bad)
    refused(bad, "not a multiple of the file's alignment")


def test_offset_wrapping_around_2_64_is_refused(base, tmp_path):
    import warnings

    layout = scan(base)
    t = layout.tensors[3]
    bad = patch_offset(base, tmp_path / "wrap.gguf", t.name, 2**64 - layout.data_start + 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        wrapped = next(x for x in gguf.GGUFReader(bad).tensors if x.name == t.name)
    assert wrapped.data_offset == 64  # the gguf package alone reads the file's header bytes as this weight
    refused(bad, "of a data section of")


@pytest.mark.parametrize(
    "name, dtype, qtype, fragment",
    [
        ("blk.0.attn_norm.weight", np.float16, Q.F16, "stored as F16; norm weights are F32"),
        ("blk.0.attn_norm.weight", np.int32, Q.I32, "stored as I32; norm weights are F32"),
        ("blk.0.ffn_up.weight", np.int32, Q.I32, "stored as I32, which holds no weights"),
    ],
)
def test_tensor_types_are_checked_for_their_role(base, tmp_path, name, dtype, qtype, fragment):
    r = gguf.GGUFReader(base)
    array = np.array(next(t for t in r.tensors if t.name == name).data)
    bad = rewrite(base, tmp_path / "types.gguf", tensors={name: ((array * 1000).astype(dtype), qtype)})
    refused(bad, fragment)


def test_a_type_changed_without_its_bytes_leaves_a_gap(base, tmp_path):
    data = bytearray(base.read_bytes())
    t = next(t for t in scan(base).tensors if t.name == "blk.0.ffn_up.weight")
    struct.pack_into("<I", data, t.end - 12, int(Q.F16))  # the type field, before the offset
    bad = tmp_path / "relabelled.gguf"
    bad.write_bytes(bytes(data))
    gguf.GGUFReader(bad)
    refused(bad, "a gap no GGUF writer leaves")


# ---------------------------------------------------------------------------------------------------- metadata
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "item, count, fragment",
    [(int(V.UINT32), 10**8, "needs 400,000,000 bytes"), (int(V.STRING), 2**62, "more than the"), (9, 10**8, "")],
)
def test_arrays_longer_than_the_file_are_refused_before_they_are_read(base, tmp_path, item, count, fragment):
    bad = insert_entry(base, tmp_path / "long.gguf", "test.array", int(V.ARRAY), struct.pack("<IQ", item, count))
    refused(bad, fragment, "truncated or corrupt")


@pytest.mark.timeout(60)
def test_a_head_count_array_is_refused(base, tmp_path):
    dropped = rewrite(base, tmp_path / "nohead.gguf", drop=("llama.attention.head_count",))
    huge = struct.pack("<IQ", int(V.UINT32), 2**40)
    bad = insert_entry(dropped, tmp_path / "heads.gguf", "llama.attention.head_count", int(V.ARRAY), huge)
    refused(bad, "truncated or corrupt")
    per_layer = rewrite(
        base, tmp_path / "perlayer.gguf", meta={"llama.attention.head_count": ([4, 4], V.ARRAY, V.UINT32)}
    )
    refused(per_layer, "llama.attention.head_count is an array of uint32 but must be an integer")


@pytest.mark.parametrize("how", ["python", "cli"])
def test_arrays_nested_5000_deep_are_refused(base, tmp_path, capsys, how):
    bad = insert_entry(base, tmp_path / "nested.gguf", "test.nested", int(V.ARRAY), nested_array(5000))
    with pytest.raises(RecursionError):  # the gguf package alone
        gguf.GGUFReader(bad)
    if how == "python":
        refused(bad, "nests arrays deeper than 2 levels")
    else:
        assert main(["generate", str(bad), "hi"]) == 2
        assert "nests arrays deeper" in capsys.readouterr().err


@pytest.mark.parametrize(
    "key, spec, fragment",
    [
        ("llama.attention.layer_norm_rms_epsilon", ("x", V.STRING), "is a string but must be a number"),
        ("llama.embedding_length", (10**12, V.UINT64), "d_model must be in"),
        (
            "tokenizer.ggml.tokens",
            ([1, 2, 3], V.ARRAY, V.INT32),
            "is an array of int32 but must be an array of strings",
        ),
        ("tokenizer.ggml.tokens", ("abc", V.STRING), "is a string but must be an array of strings"),
        ("tokenizer.ggml.merges", ([1, 2], V.ARRAY, V.INT32), "merges is an array of int32"),
        ("tokenizer.chat_template", (5, V.UINT32), "chat_template is uint32 but must be a string"),
    ],
)
def test_metadata_of_the_wrong_type_is_refused_by_name(base, tmp_path, key, spec, fragment):
    refused(rewrite(base, tmp_path / "typed.gguf", meta={key: spec}), fragment)


def _tokens_and_merges(base):
    r = gguf.GGUFReader(base)
    return r.fields["tokenizer.ggml.tokens"].contents(), r.fields["tokenizer.ggml.merges"].contents()


def test_a_token_listed_twice_is_refused(base, tmp_path):
    tokens, _ = _tokens_and_merges(base)
    tokens[7] = tokens[6]
    bad = rewrite(base, tmp_path / "dup.gguf", meta={"tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING)})
    refused(bad, "is listed twice in tokenizer.ggml.tokens (ids 6 and 7)")


@pytest.mark.parametrize("how", ["python", "cli"])
def test_a_merge_without_a_space_is_refused(base, tmp_path, capsys, how):
    _, merges = _tokens_and_merges(base)
    merges[0] = merges[0].replace(" ", "")
    bad = rewrite(base, tmp_path / "merge.gguf", meta={"tokenizer.ggml.merges": (merges, V.ARRAY, V.STRING)})
    if how == "python":
        refused(bad, "merge 0 of tokenizer.ggml.merges", "not two tokens separated by one space")
    else:
        assert main(["generate", str(bad), "hi"]) == 2
        assert "not two tokens separated" in capsys.readouterr().err


def test_a_merge_of_unknown_tokens_is_refused(base, tmp_path):
    _, merges = _tokens_and_merges(base)
    merges[3] = "zzqq xxjj"
    bad = rewrite(base, tmp_path / "merge.gguf", meta={"tokenizer.ggml.merges": (merges, V.ARRAY, V.STRING)})
    refused(bad, "merge 3", "which is not in tokenizer.ggml.tokens")


# ---------------------------------------------------------------------------------------------------- properties
def _outcome(path, ids):
    """The logits of the loaded file, or None when it is refused (any other exception fails the test)."""
    try:
        p = lm.load(path)
    except LMError:
        return None
    with torch.no_grad():
        return p.model(ids)


@pytest.mark.timeout(300)
def test_byte_flips_in_the_structure_give_the_same_model_or_a_refusal(base, logits, tmp_path):
    """Every length, type, count, dimension and offset field, one bit flipped at a time (a seeded sample): the file
    is refused, or it loads to exactly the same logits. Flips inside values (a weight, a rope base) change the model
    and cannot be told from the real thing: GGUF carries no checksum."""
    ids, reference = logits
    data = base.read_bytes()
    spans = scan(base).structural
    rng = np.random.default_rng(0)
    picks = rng.choice(len(spans), size=60, replace=False)
    for n, i in enumerate(picks):
        start, end = spans[i]
        at = int(rng.integers(start, end))
        flipped = bytearray(data)
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        path = tmp_path / f"flip{n}.gguf"
        path.write_bytes(bytes(flipped))
        out = _outcome(path, ids)
        assert out is None or torch.equal(out, reference), f"byte {at} ({start}..{end}) changed the model silently"


@pytest.mark.timeout(120)
def test_truncations_are_refused(base, tmp_path):
    data = base.read_bytes()
    rng = np.random.default_rng(1)
    for n, cut in enumerate(sorted(rng.integers(1, len(data), size=20))):
        path = tmp_path / f"cut{n}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(LMError):
            lm.load(path)
