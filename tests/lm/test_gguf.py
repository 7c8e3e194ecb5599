"""GGUF files written by the gguf package's own writer from random HF Llama models: parity with the HF model, the
RoPE layout, dequantisation against gguf's own, the tokenizer and chat template from the file, hostile files."""

import struct

import numpy as np
import pytest
import torch

from hf_families import hf_model, write_gguf
from multihead import lm
from multihead.lm import LMError
from multihead.lm.gguf_file import GGUFFile, permute, unpermute


@pytest.fixture(scope="module")
def llama():
    return hf_model("llama", rope_scaling=None)


@pytest.fixture(scope="module")
def gguf_path(llama, tmp_path_factory):
    return write_gguf(llama, tmp_path_factory.mktemp("g") / "tiny.gguf")


def test_gguf_model_matches_hf(llama, gguf_path):
    ours = lm.load(gguf_path)
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours.model(ids) - llama(ids).logits).abs().max() < 1e-4


def test_rope_layout_matters_and_is_undone(llama, tmp_path):
    w = torch.randn(4 * 16, 64)
    assert torch.equal(unpermute(permute(w, 4), 4), w)
    assert not torch.equal(permute(w, 4), w)
    # a file written without llama.cpp's permutation is read as if it had it: a wrong model, not an error
    wrong = lm.load(write_gguf(llama, tmp_path / "unpermuted.gguf", permute=False))
    ids = torch.randint(0, 300, (1, 40))
    with torch.no_grad():
        assert (wrong.model(ids) - llama(ids).logits).abs().max() > 1e-2


def test_dequantisation_is_ggufs_own(llama, tmp_path):
    import gguf

    path = write_gguf(llama, tmp_path / "q8.gguf", quantize=("ffn_up.weight", "token_embd.weight"))
    g = GGUFFile(path)
    t = g.tensors["blk.0.ffn_up.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    ref = gguf.quants.dequantize(t.data, t.tensor_type)
    assert np.array_equal(g.tensor("blk.0.ffn_up.weight").numpy(), ref)
    original = llama.model.layers[0].mlp.up_proj.weight.detach()
    step = original.abs().max() / 127  # Q8_0: 8-bit steps of each block's absolute maximum
    assert (g.tensor("blk.0.ffn_up.weight") - original).abs().max() <= step
    ours = lm.load(path)  # the quantised model loads and runs
    with torch.no_grad():
        assert torch.isfinite(ours.model(torch.randint(0, 300, (1, 8)))).all()


def test_tokenizer_and_chat_template_come_from_the_file(gguf_path):
    ours = lm.load(gguf_path)
    ids = ours.encode("the cat sat on the mat")
    assert ids[0] == 0  # add_bos_token: the file's BOS first
    assert ours.decode(ids[1:]) == "the cat sat on the mat"
    assert ours.encode("<|unused3|>", special=False) == [ours.tokenizer.token_to_id("<|unused3|>")]  # never split
    assert ours.chat("hello") == "<|im_start|>user\nhello"


# ---------------------------------------------------------------------------------------------------- hostile files
def test_truncated_file_is_refused(gguf_path, tmp_path):
    data = gguf_path.read_bytes()
    for cut in (10, 2000, len(data) // 2, len(data) - 8):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(LMError, match="truncated|corrupt|not a GGUF"):
            lm.load(bad)


def test_not_gguf_and_absurd_counts_are_refused(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(LMError, match="not a GGUF file"):
        lm.load(bad)
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 2) + b"\0" * 100)
    with pytest.raises(LMError, match="more than"):
        lm.load(bad)
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 1, 1) + b"\0" * 100)
    with pytest.raises(LMError, match="version 9"):
        lm.load(bad)


def test_wrong_tensor_shape_and_unknown_architecture(llama, tmp_path):
    bad = write_gguf(llama, tmp_path / "shape.gguf", shape=("blk.1.ffn_down.weight", (64, 95)))
    with pytest.raises(LMError, match="wrong shape.*down_proj"):
        lm.load(bad)
    other = write_gguf(llama, tmp_path / "arch.gguf", arch="gpt2")
    with pytest.raises(LMError, match="architecture 'gpt2' is not supported"):
        lm.load(other)
    extra = write_gguf(llama, tmp_path / "layers.gguf", layers=1)  # metadata says 1 layer, tensors hold 2
    with pytest.raises(LMError, match="unexpected tensor 'blk.1"):
        lm.load(extra)


def test_hostile_metadata_sizes_are_refused_before_allocation(llama, tmp_path):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bad = write_gguf(llama, tmp_path / "huge.gguf", layers=10**6)
    with pytest.raises(LMError, match="num_layers|ceiling"):
        lm.load(bad)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: no million-layer model


def test_gemma3_gguf_matches_hf_with_its_sentencepiece_vocabulary(tmp_path):
    from hf_families import write_gemma_gguf

    gemma = hf_model("gemma3")
    ours = lm.load(write_gemma_gguf(gemma, tmp_path / "gemma.gguf"))
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(2))  # past the 8-key window
    with torch.no_grad():
        assert (ours.model(ids) - gemma(ids).logits).abs().max() < 1e-4
    assert ours.model.config.embed_scale and ours.model.config.decoder.sliding_window == 8
    ids = ours.encode("the cat sat")
    assert ids[0] == 2 and ours.decode(ids[1:]) == "the cat sat"  # BOS, then SentencePiece pieces
    # whole pieces where the vocabulary has them; no space is prepended (add_space_prefix false), so "the" is spelt
    assert [ours.tokenizer.id_to_token(i) for i in ids[1:]] == ["t", "h", "e", "▁cat", "▁sat"]
    assert ours.decode(ours.encode("ß", special=False)) == "ß"  # no piece for it: UTF-8 byte fallback
