"""StreamingLLM caches (sinks + sliding window, positions within the cache): exactness against a full forward pass
over the kept tokens, refusals, and the three-policy comparison."""

import pytest
import torch

from multihead.interpret.kv import streaming as S
from multihead.models import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig
from multihead.modules.variants import AttentionConfig
from multihead.modules.kv import KVCache


def lm(positional="rope", max_len=16, kv=None, seed=0, layers=2):
    torch.manual_seed(seed)
    return (
        CausalLM(
            CausalLMConfig(
                vocab_size=50,
                max_len=max_len,
                positional=positional,
                decoder=DecoderConfig(
                    d_model=32,
                    num_heads=4,
                    attention=AttentionConfig(num_kv_heads=kv),
                    num_layers=layers,
                    d_ff=64,
                    dropout=0.0,
                    norm_first=True,
                    cross_attention=False,
                ),
            )
        )
        .eval()
        .double()
    )


@pytest.mark.parametrize("sinks, window, kv", [(4, 6, None), (0, 6, None), (2, 5, 2), (1, 2, 1)])
def test_streaming_cache_equals_a_full_forward_over_the_kept_tokens(sinks, window, kv):
    """One layer: each step's output is exactly a plain forward pass over the kept tokens (sinks + window) at
    positions 0..n-1. (With more layers a cached token's deeper keys were computed from the window of *its* time,
    which a fresh pass over the kept tokens would not reproduce: StreamingLLM is not window re-computation.)"""
    model = lm(kv=kv, layers=1)
    ids = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(sinks=sinks, window=window)
    with torch.no_grad():
        model(ids[:, :3], cache=cache)  # a short prompt first (no eviction yet), then one token per step
        for t in range(3, ids.shape[1]):
            got = model(ids[:, t : t + 1], cache=cache)[:, -1]
            kept = list(range(min(sinks, t + 1))) + list(range(max(sinks, t + 1 - window), t + 1))
            want = model(ids[:, kept])[:, -1]  # a plain forward pass: the kept tokens at positions 0..n-1
            assert torch.allclose(got, want, atol=1e-10), f"step {t}"
    assert cache.self_attn[0].length == sinks + window and cache.self_attn[0].seen == 30
    assert cache.self_attn[0].k.shape[1] == (kv or 4)  # GQA: only the key/value heads are cached


def test_every_layer_keeps_exactly_the_full_caches_entries_of_the_kept_tokens():
    """Deeper layers: after many evictions the streaming cache holds, slot by slot, exactly the keys/values (before
    rotation) that each kept token (the first 3, then the last 5) produced when it was fed -- no other token, no
    shifted or re-computed entry."""
    model = lm(layers=3)
    ids = torch.randint(0, 50, (1, 24), generator=torch.Generator().manual_seed(4))
    sinks, window = 3, 5
    stream, raw = model.new_cache(sinks=sinks, window=window), {}
    with torch.no_grad():
        for t in range(ids.shape[1]):
            model(ids[:, t : t + 1], cache=stream)
    kept = list(range(sinks)) + list(range(ids.shape[1] - window, ids.shape[1]))
    # the reference: the same tokens fed one by one with each token's own (sinks + window) context, recorded per layer
    ref = model.new_cache(sinks=sinks, window=window)
    with torch.no_grad():
        for t in range(ids.shape[1]):
            model(ids[:, t : t + 1], cache=ref)
            for i, c in enumerate(ref.self_attn):
                raw[(i, t)] = (c.k[:, :, -1].clone(), c.v[:, :, -1].clone())  # the token just added
    for i, c in enumerate(stream.self_attn):
        for slot, t in enumerate(kept):
            assert torch.equal(c.k[:, :, slot], raw[(i, t)][0]) and torch.equal(c.v[:, :, slot], raw[(i, t)][1])


def test_streaming_generation_matches_the_same_cache_fed_by_hand():
    from multihead.models import generate

    model = lm(max_len=8)
    prompt = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(2))
    out = generate(model, prompt, None, model.new_cache(sinks=2, window=6), max_new_tokens=20)  # past max_len=8
    cache = model.new_cache(sinks=2, window=6)
    with torch.no_grad():
        logits = model(prompt, cache=cache)[:, -1]
        toks = []
        for _ in range(20):
            toks.append(int(logits.argmax(-1)))
            logits = model(torch.tensor([[toks[-1]]]), cache=cache)[:, -1]
    assert out.tokens[0] == toks


def test_refusals_name_the_fix():
    learned = lm(positional="learned")
    with pytest.raises(ValueError, match="positional='rope'"):
        learned(torch.zeros(1, 3, dtype=torch.long), cache=learned.new_cache(window=4))
    with pytest.raises(ValueError, match="positional='rope'"):
        learned(torch.zeros(1, 20, dtype=torch.long), cache=KVCache(2, extrapolate=True))
    model = lm()
    with pytest.raises(ValueError, match="beyond the 16 positions"):
        model(torch.zeros(1, 20, dtype=torch.long), cache=model.new_cache())  # no extrapolation unless asked
    model(torch.zeros(1, 20, dtype=torch.long), cache=KVCache(2, extrapolate=True))  # asked: runs
    # no position table at all (MLA's own rotary key, or none): past max_len only when asked, as rotary
    table_free = lm(positional="none")
    with pytest.raises(ValueError, match="beyond the 16 positions"):
        table_free(torch.zeros(1, 20, dtype=torch.long))
    assert table_free(torch.zeros(1, 20, dtype=torch.long), cache=KVCache(2, extrapolate=True)).shape[1] == 20
    cache = model.new_cache(sinks=1, window=3)
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="one token per step"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
    keep = torch.tensor([[False, True, True]])
    with pytest.raises(ValueError, match="unpadded rows"):
        model(torch.zeros(1, 3, dtype=torch.long), keep, cache=model.new_cache(window=4))
    with pytest.raises(ValueError, match="sinks >= 0 and window >= 1"):
        model.new_cache(sinks=-1, window=4)


def test_the_three_policies_agree_inside_the_window_and_report_bands():
    model = lm(max_len=8)
    ids = torch.randint(0, 50, (2, 25), generator=torch.Generator().manual_seed(3))
    r = S.compare(model, ids, window=8, sinks=2, band=8)
    full, window, sinks = (S.stream(model, ids, policy=p, window=8, sinks=2)["loss"] for p in S.POLICIES)
    # while nothing is evicted (the first 8 tokens, i.e. predicting positions 1..7) the caches are identical
    assert torch.allclose(full[:, :7], window[:, :7]) and torch.allclose(full[:, :7], sinks[:, :7])
    assert [b["to"] for b in r["policies"]["full"]["bands"]] == [8, 16, 24]
    share = torch.tensor(r["policies"]["sinks"]["first_share"])
    assert share.shape == (2, 4) and bool(((share >= 0) & (share <= 1)).all())
    assert "window 8 + 2 sinks" in S.format_table(r)
