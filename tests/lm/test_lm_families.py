"""Each causal-LM family (random weights, no package needed) loaded by us vs HF transformers: logits, every head's
pattern, greedy generation, the KV cache, sharded folders, export -> HF load, and bad folders."""

import json

import pytest
import torch

from hf_families import hf_model
from multihead import lm
from multihead.lm import LMError
from multihead.models.generation import generate
from multihead.modules.capture import capture

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2", "gemma3"]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    model = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, lm.load(folder)


def test_logits_and_patterns_match_hf(pair):
    name, hf, ours = pair
    ids = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        fast = ours.model(ids)  # the fused kernel
        with capture(ours.model) as c:
            ours.model(ids)
    assert (fast - ref.logits).abs().max() < 1e-4, name
    patterns = c.patterns()
    assert len(patterns) == len(ref.attentions)
    for a, b in zip(patterns, ref.attentions):
        assert a.shape == b.shape  # (B, H, L, L): every query head, GQA expanded
        assert (a - b).abs().max() < 1e-5, name


def test_family_specific_parts_are_there(pair):
    name, hf, ours = pair
    attn = ours.model.decoder.layers[0].self_attn
    if name == "qwen3":
        assert attn.head_dim == 24 and attn.q_norm is not None  # wider heads than d/H, QK-norm
    if name == "qwen2":
        assert attn.w_q.bias is not None and attn.w_o.bias is None and ours.model.config.tie_embeddings
    if name != "gpt2":
        assert attn.num_kv_heads == (1 if name == "gemma3" else 2) and ours.model.config.decoder.norm == "rms"
    if name == "llama":
        assert ours.model.config.decoder.rope_scaling["rope_type"] == "llama3"
    if name == "gemma3":  # five local layers of 8 keys, the sixth global, each with its own rotary base
        d = ours.model.config.decoder
        assert [d.is_local(i) for i in range(6)] == [True] * 5 + [False] and d.sliding_window == 8
        assert ours.model.decoder.layers[0].self_attn.rotary is not ours.model.decoder.layers[5].self_attn.rotary


def test_greedy_generation_matches_hf(pair):
    name, hf, ours = pair
    prompt = torch.randint(0, 300, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=0)
    out = generate(ours.model, prompt, None, strategy="greedy", max_new_tokens=24)
    assert out.tokens[0] == ref[0, 7:].tolist(), name


def test_cache_and_left_padding_agree_with_full_forward(pair):
    name, hf, ours = pair
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ours.model(ids)[:, -1]
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[1, :5] = False  # row 1 left-padded: its 15 real tokens alone
        logits, cache = ours.model.prefill(ids[:, :-1], keep[:, :-1])
        step = ours.model.step(ids[:, -1], cache)
        alone = ours.model(ids[1:, 5:])[:, -1]
    assert (step[0] - full[0]).abs().max() < 1e-4
    assert (step[1] - alone[0]).abs().max() < 1e-4


def test_head_mask_and_pruning_work_on_a_loaded_model(pair):
    name, hf, ours = pair
    model = ours.model
    ids = torch.randint(0, 300, (1, 16))
    layers, heads = len(model.decoder.layers), model.decoder.layers[0].self_attn.num_heads
    mask = torch.ones(layers, heads)
    mask[0, :2] = 0  # one whole GQA group (2 query heads share a KV head)
    with torch.no_grad():
        masked = model(ids, head_mask=mask)
        import copy

        pruned = copy.deepcopy(model)
        pruned.decoder.layers[0].self_attn.prune_heads([0, 1])
        assert (pruned(ids) - masked).abs().max() < 1e-5


def test_export_roundtrip_loads_in_hf_with_the_same_logits(pair, tmp_path):
    import transformers

    name, hf, ours = pair
    out = lm.export(ours.model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    # Mistral without a sliding window is Llama's architecture: written as Llama
    expected = "LlamaForCausalLM" if name == "mistral" else type(hf).__name__
    assert type(back).__name__ == expected
    ids = torch.randint(0, 300, (1, 30))
    with torch.no_grad():
        assert (back(ids).logits - ours.model(ids)).abs().max() < 1e-4
    again = lm.load(out)  # and ours reads it back
    with torch.no_grad():
        assert (again.model(ids) - ours.model(ids)).abs().max() == 0


def test_sharded_folder_loads(tmp_path):
    model = hf_model("llama")
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = lm.load(tmp_path)
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        assert (ours.model(ids) - model(ids).logits).abs().max() < 1e-4


def test_rope_scalings_match_hf(tmp_path):
    for scaling in (
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    ):
        model = hf_model("llama", rope_scaling=scaling)
        model.save_pretrained(tmp_path / scaling["rope_type"])
        ours = lm.load(tmp_path / scaling["rope_type"])
        ids = torch.randint(0, 300, (1, 100))
        with torch.no_grad():
            assert (ours.model(ids) - model(ids).logits).abs().max() < 1e-4, scaling


def test_pruned_model_export_is_refused_with_the_reason(tmp_path):
    model = hf_model("gpt2")
    model.save_pretrained(tmp_path / "in")
    ours = lm.load(tmp_path / "in")
    ours.model.decoder.layers[0].self_attn.prune_heads([1])
    with pytest.raises(LMError, match="pruned heads"):
        lm.export(ours.model, tmp_path / "out")


# ---------------------------------------------------------------------------------------------------- bad input
def _folder(tmp_path, config: dict, name="bad"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_unknown_model_type_names_the_supported_ones(tmp_path):
    with pytest.raises(LMError, match="not a supported causal LM.*llama"):
        lm.load(_folder(tmp_path, {"model_type": "gemma2", "hidden_size": 8}))


def test_hostile_sizes_are_refused_before_anything_is_allocated(tmp_path):
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "intermediate_size": 11008,
        "vocab_size": 10**12,
        "max_position_embeddings": 4096,
    }
    with pytest.raises(LMError, match="ceiling|must be in"):
        lm.load(_folder(tmp_path, config))
    assert time.perf_counter() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing of the model's size
    with pytest.raises(LMError, match="num_hidden_layers"):
        lm.load(_folder(tmp_path, {**config, "vocab_size": 10, "num_hidden_layers": -3}, "neg"))


def test_wrong_tensor_shapes_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    model = hf_model("llama")
    model.save_pretrained(tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(95, 64)
    save_file(tensors, tmp_path / "m" / "model.safetensors")
    with pytest.raises(LMError, match=r"wrong shape.*up_proj"):
        lm.load(tmp_path / "m")


def test_truncated_weights_and_pickles_are_refused(tmp_path):
    model = hf_model("gpt2")
    model.save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(LMError, match="truncated or corrupt"):
        lm.load(tmp_path / "m")
    path.unlink()
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"not really")
    with pytest.raises(LMError, match="never pickled"):
        lm.load(tmp_path / "m")


def test_local_layers_run_through_the_window_backend(tmp_path):
    from multihead.attention import registry

    hf_model("gemma3").save_pretrained(tmp_path)
    ours = lm.load(tmp_path)
    seen = []
    real = registry.resolve

    def spy(*args, **kwargs):
        backend = real(*args, **kwargs)
        seen.append(backend.name)
        return backend

    registry.resolve = spy
    try:
        with torch.no_grad():
            ours.model(torch.randint(0, 300, (1, 40)))
    finally:
        registry.resolve = real
    assert seen.count("window") == 5 and len(seen) == 6  # the five local layers: no dense mask


def test_mistral_with_a_sliding_window_matches_hf_past_the_window(tmp_path):
    import transformers

    model = hf_model("mistral", sliding_window=8)
    model.save_pretrained(tmp_path / "in")
    ours = lm.load(tmp_path / "in")
    assert ours.model.config.decoder.sliding_window == 8
    ids = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        assert (ours.model(ids) - model(ids).logits).abs().max() < 1e-4
        prompt = ids[:1, :6]
        ref = model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    assert generate(ours.model, prompt, None, max_new_tokens=20).tokens[0] == ref[0, 6:].tolist()  # window steps
    back = transformers.AutoModelForCausalLM.from_pretrained(lm.export(ours.model, tmp_path / "out")).eval()
    assert back.config.sliding_window == 8
    with torch.no_grad():
        assert (back(ids).logits - ours.model(ids)).abs().max() < 1e-4


def test_qwen2_layer_split_windows_are_refused_with_the_fix(tmp_path):
    config = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "vocab_size": 300,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "use_sliding_window": True,
    }
    with pytest.raises(LMError, match="use_sliding_window"):
        lm.load(_folder(tmp_path, config))


def test_unknown_name_says_what_is_accepted():
    with pytest.raises(LMError, match="smollm2"):
        lm.load("no-such-model")
