"""multihead's KV policies on attached HF causal LMs through transformers' own cache API (`PolicyCache` as
``past_key_values``): the same Llama read natively and attached writes the same tokens under every policy and budget,
HF's ``generate`` runs each policy on several architectures, per-head evictions free their bytes, and what a policy
cannot do is refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf, loading  # noqa: E402
from multihead.cli import main  # noqa: E402
from multihead.hf.stream import StreamCache  # noqa: E402
from multihead.hf.cache import PolicyCache, cache_argument  # noqa: E402
from multihead.models.generation import generate  # noqa: E402
from multihead.modules.kv import make_policy  # noqa: E402

from .archs import ARCHS  # noqa: E402
from .test_attached_load_report import _save  # noqa: E402

PROMPT, NEW = 60, 16


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("llama"), "llama", max_position_embeddings=256)


def _hf_generate(model, ids, cache, **kw):
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
        **cache_argument(model, cache),
        **kw,
    )
    return out[0, ids.shape[1] :].tolist()


POLICIES = [
    ("full", None, {}),
    *(
        (name, b, {})
        for name in ("window", "h2o", "snapkv", "tova", "knorm", "pyramidkv", "adakv", "expected")
        for b in (12, 24)
    ),
    ("head-aware", 12, {"full_heads": [[0], [1]]}),
    ("head-aware", 24, {"full_heads": [[], [0, 1]]}),
]


@pytest.mark.parametrize(("policy", "budget", "options"), POLICIES)
def test_native_and_attached_write_the_same_tokens_under_every_policy(llama, policy, budget, options):
    native = loading.load(str(llama)).model
    attached = loading.load(f"hf:{llama}").model.hf
    ids = torch.randint(3, 280, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    made = make_policy(policy, budget, **options)
    ours = generate(native, ids, torch.ones_like(ids, dtype=torch.bool), max_new_tokens=NEW, kv_policy=made)
    cache = PolicyCache(attached, policy, budget, **options)
    assert _hf_generate(attached, ids, cache) == ours.tokens[0]
    if budget is not None:  # the cache really holds less than every key
        c = attached.config
        d = c.hidden_size // c.num_attention_heads
        every = c.num_hidden_layers * c.num_key_value_heads * (PROMPT + NEW - 1) * d * 2 * 4
        assert cache.kv_nbytes() < every


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt_neox"])
def test_hf_generate_runs_each_policy_on_attached_architectures(name):
    model = ARCHS[name].build()
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    own = model.generate(input_ids=ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    hf.attach(model)
    assert _hf_generate(model, ids, PolicyCache(model, "full")) == own[0, 40:].tolist()  # full: HF's own tokens
    for policy in ("window", "h2o", "snapkv"):
        cache = PolicyCache(model, policy, 16)
        tokens = _hf_generate(model, ids, cache)
        assert len(tokens) == NEW
        per_head = 16 + (NEW - 1 if policy == "snapkv" else 0)  # SnapKV keeps what is generated after the prompt
        recs = list(hf.attached(model).layers.values())
        g, d, layers = recs[0].num_kv_heads, recs[0].head_dim, len(recs)
        assert cache.kv_nbytes() == layers * g * per_head * d * 2 * 4, policy  # keys + values, float32


def test_per_head_evictions_free_their_bytes(llama):
    attached = loading.load(f"hf:{llama}").model.hf
    ids = torch.randint(3, 280, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    cache = PolicyCache(attached, "head-aware", 12, full_heads=[[0], []])
    _hf_generate(attached, ids, cache)
    seen = PROMPT + NEW - 1  # the last token is written, never read
    d = attached.config.hidden_size // attached.config.num_attention_heads
    g = attached.config.num_key_value_heads
    kept = (seen + (g - 1) * 12) + g * 12  # layer 0: one head keeps every key, the other 12; layer 1: 12 each
    assert cache.kv_nbytes() == kept * d * 2 * 4
    layer0 = cache.native.self_attn[0].groups
    assert sorted(grp.buffers.k.shape[2] for grp in layer0) == [12, seen]  # the tensors themselves are that size


def test_adakv_frees_what_it_evicts_per_head(llama):
    """Ada-KV gives each key/value head its own number of keys; the cache's tensors are that size (kvpress's
    AdaKVPress masks the evicted keys and keeps them)."""
    attached = loading.load(f"hf:{llama}").model.hf
    ids = torch.randint(3, 280, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    cache = PolicyCache(attached, "adakv", 16, window=4)
    attached(input_ids=ids, **cache_argument(attached, cache))
    d = attached.config.hidden_size // attached.config.num_attention_heads
    g = attached.config.num_key_value_heads
    for layer in cache.native.self_attn:
        lengths = [grp.length for grp in layer.groups]
        assert [grp.buffers._k.shape[2] for grp in layer.groups] == [n + 1 for n in lengths]  # + one step's room
        assert sum(lengths) == g * 16 and min(lengths) >= 4  # the layer's budget, shared; the window in each
    assert cache.kv_nbytes() == attached.config.num_hidden_layers * g * 16 * d * 2 * 4


def test_the_kv_verb_takes_an_hf_folder_and_agrees_with_the_native_reading(llama, tmp_path):
    argv = ["--budgets", "12,24", "--lengths", "160", "--needles", "2", "--context", "48", "--tokens", "24"]
    argv += ["--policies", "full,window,h2o,snapkv", "--no-progress"]
    for name, source in (("native", str(llama)), ("attached", f"hf:{llama}")):
        assert main(["kv", source, "--out", str(tmp_path / name), *argv]) == 0
    a, b = (json.loads((tmp_path / n / "kv.json").read_text()) for n in ("native", "attached"))
    for pa, pb in zip(a["perplexity"]["points"], b["perplexity"]["points"]):
        assert (pa["policy"], pa["budget"]) == (pb["policy"], pb["budget"])
        assert pa["perplexity"] == pytest.approx(pb["perplexity"], rel=1e-4)
    assert [p["needles_exact"] for p in a["points"]] == [p["needles_exact"] for p in b["points"]]
    assert [p["kv_bytes"] for p in a["points"]] == [p["kv_bytes"] for p in b["points"]]


def test_what_a_policy_cache_cannot_do_is_refused_with_the_reason(llama):
    attached = loading.load(f"hf:{llama}").model
    ids = torch.randint(3, 280, (2, 20), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="at least 5 keys"):
        PolicyCache(attached.hf, "window", 3)
    with pytest.raises(ValueError, match="unknown KV policy"):
        PolicyCache(attached.hf, "lru", 16)
    with pytest.raises(ValueError, match="multihead.hf.stream.StreamCache"):
        PolicyCache(attached.hf, "streaming", 16)
    with pytest.raises(ValueError, match="names 3 layers"):
        PolicyCache(attached.hf, "head-aware", 16, full_heads=[[0], [0], [0]])
    with pytest.raises(ValueError, match="cannot be cropped"):
        PolicyCache(attached.hf, "window", 12).crop(4)
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[1, :3] = False
    with pytest.raises(ValueError, match="unpadded rows"):
        attached(ids, keep, cache=attached.new_cache(policy="window", budget=12))
    bart = ARCHS["bart"].build()
    hf.attach(bart)
    with pytest.raises(hf.AttachError, match="encoder-decoder"):
        PolicyCache(bart, "window", 12)
    bloom = ARCHS["bloom"].build()  # ALiBi: its attention never reaches the registry, so no policy cache follows it
    with pytest.raises(hf.AttachError, match="not attached"):
        PolicyCache(bloom, "window", 12)
    hf.attach(bloom)  # by observation: its own attention runs, which a policy cache cannot enter
    try:
        with pytest.raises(
            hf.AttachError, match="a KV-policy cache needs multihead.s attention function .* by observation"
        ):
            PolicyCache(bloom, "window", 12)
        with pytest.raises(hf.AttachError, match="a streaming cache needs multihead's attention function"):
            StreamCache(bloom, window=8, sinks=2)
    finally:
        hf.detach(bloom)


def _generate_rows(model, ids, mask, cache):
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=8,
        min_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
        **cache_argument(model, cache),
    )
    return out[:, ids.shape[1] :].tolist()


@pytest.mark.parametrize(("policy", "budget"), [("full", None), ("window", 16), ("h2o", 16)])
def test_a_left_padded_batch_is_refused_where_its_tokens_would_differ(llama, policy, budget):
    """A batch whose second row is left-padded by 30 tokens: HF's own cache writes that row's tokens as it writes
    the row alone; a policy cache, which counts each row's positions from its first key, would not, so it refuses
    the batch before any layer runs."""
    model = loading.load(f"hf:{llama}").model.hf
    ids = torch.randint(1, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    padded, mask = ids.clone(), torch.ones_like(ids)
    padded[1, :30], mask[1, :30] = 0, 0
    alone = _generate_rows(model, ids[1:, 30:], torch.ones_like(ids[1:, 30:]), None)[0]
    assert _generate_rows(model, padded, mask, None)[1] == alone  # HF's own cache: the same tokens
    with pytest.raises(hf.AttachError, match="unpadded rows.*one row at a time"):
        _generate_rows(model, padded, mask, PolicyCache(model, policy, budget))
    if policy == "full":  # the row alone, unpadded, is served: the same tokens as HF's cache
        ones = torch.ones_like(ids[1:, 30:])
        assert _generate_rows(model, ids[1:, 30:], ones, PolicyCache(model, policy, budget))[0] == alone


def test_one_policy_cache_serves_one_generation(llama):
    """A second generate with a used cache (the same prompt, or a shorter one) is refused, not answered with other
    tokens or transformers' reshape error."""
    model = loading.load(f"hf:{llama}").model.hf
    ids = torch.randint(1, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(ids)
    cache = PolicyCache(model, "h2o", 16)
    first = _generate_rows(model, ids, ones, cache)
    assert first == _generate_rows(model, ids, ones, PolicyCache(model, "h2o", 16))
    longer = torch.cat([ids, ids], 1)
    # transformers 4.x slices a prompt no longer than the cache to nothing before it calls the model, and fails there
    # itself (an IndexError of its own: loud, never other tokens); 5.x calls the model, and the cache refuses
    prompts = (ids, ids[:, :10], longer) if int(transformers.__version__.split(".")[0]) >= 5 else (longer,)
    for prompt in prompts:
        with pytest.raises(hf.AttachError, match="one cache serves one generation.*new PolicyCache"):
            _generate_rows(model, prompt, torch.ones_like(prompt), cache)


def test_a_policy_cache_made_for_another_model_is_refused_by_name(llama, tmp_path):
    two = loading.load(f"hf:{llama}").model.hf
    three = loading.load(f"hf:{_save(tmp_path / 'three', 'llama', num_hidden_layers=3)}").model.hf
    ids = torch.randint(1, 300, (1, 20), generator=torch.Generator().manual_seed(3))
    for model, other in ((three, two), (two, three)):
        with pytest.raises(hf.AttachError, match="made for another model \\(LlamaForCausalLM with"):
            _generate_rows(model, ids, torch.ones_like(ids), PolicyCache(other, "window", 12))


def test_a_cache_holding_a_context_is_continued_by_generate_as_hf_s_own_cache_is(llama):
    """kvpress's protocol: the context fills the cache in one call, then generate continues it with the question.
    Under ``full`` the tokens are HF's own cache's; under an evicting policy the question attends what was kept."""
    from transformers import DynamicCache

    model = loading.load(f"hf:{llama}").model.hf
    ids = torch.randint(1, 300, (1, 48), generator=torch.Generator().manual_seed(4))

    def two_steps(cache):
        with torch.no_grad():
            model(ids[:, :40], past_key_values=cache, use_cache=True)  # the context
        return _generate_rows(model, ids, torch.ones_like(ids), cache)  # the question, then the answer

    full = PolicyCache(model, "full")
    assert two_steps(full) == two_steps(DynamicCache())
    snap = PolicyCache(model, "snapkv", 16)
    assert len(two_steps(snap)[0]) == 8  # what _generate_rows asks for
    assert snap.kv_nbytes() < full.kv_nbytes()
    with pytest.raises(hf.AttachError, match="one cache serves one generation"):  # after a generation: refused
        _generate_rows(model, torch.cat([ids, ids], 1), torch.ones(1, 96, dtype=torch.long), snap)


@torch.no_grad()
def test_a_cache_read_through_hf_is_freed_when_its_reader_drops_it(llama):
    import gc
    import weakref

    model = loading.load(f"hf:{llama}").detail.model
    ids = torch.randint(3, 290, (1, 40), generator=torch.Generator().manual_seed(0))
    gone = []
    for name in ("snapkv", "window"):
        cache = model.new_cache(policy=name, budget=16)
        model.prefill(ids, cache=cache)
        model.step(ids[:, -1], cache)  # HF's view of it made and reused
        gone.append(weakref.ref(cache))
        del cache
    recorded = model.new_cache(record=True)
    model.prefill(ids, cache=recorded)
    for _ in range(3):
        kept = recorded.compress(make_policy("tova", 16), prompt_only=True)
        model.step(ids[:, -1], kept)
        gone.append(weakref.ref(kept))
        del kept
    gc.collect()
    assert [r() for r in gone] == [None] * len(gone)  # no table of views keeps a cache, its keys and values alive


@pytest.mark.parametrize("policy", ["window", "h2o", "snapkv"])
def test_hf_beam_search_reorders_a_policy_cache_with_each_rows_kept_keys(llama, policy):
    """HF's beam search reorders the cache's rows (each row's kept keys go with it, as the native reorder test
    checks under eviction): under a budget that keeps every key, the beams are HF's own with its plain cache."""
    attached = loading.load(f"hf:{llama}").model
    ids = torch.randint(3, 280, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    plain = _hf_generate(attached.hf, ids, transformers.DynamicCache(), num_beams=3)
    big = PolicyCache(attached.hf, policy, 4 * (PROMPT + NEW))
    assert _hf_generate(attached.hf, ids, big, num_beams=3) == plain
