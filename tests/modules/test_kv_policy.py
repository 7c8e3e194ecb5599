"""KV policies, each checked against a definition written here: a window policy equals a window mask on a full call,
H2O keeps the keys with the largest accumulated attention (a step-by-step reimplementation with sets), SnapKV keeps
what its observation window attends to (explicit sums and pooling), the head-aware split equals a per-head mask,
the full policy equals today's cache exactly, evicted memory is released, and bad budgets are refused."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from multihead.models.generation import generate
from multihead.models.seq2seq import CausalLM, CausalLMConfig, Seq2Seq, Seq2SeqConfig
from multihead.modules.attention import MultiHeadAttention
from multihead.modules.decoder import DecoderConfig
from multihead.modules.kv import (
    StreamingKV,
    KV_POLICIES,
    TOVA,
    AdaKV,
    HeavyHitters,
    KeyNorm,
    PolicyKV,
    PyramidKV,
    SinksWindow,
    SnapKV,
    make_policy,
)
from multihead.modules.positional import RotaryEmbedding

E, H, G, D = 32, 4, 2, 8
P, STEPS = 24, 10  # prompt length, decoding steps


def _mha(seed: int = 0, kv: int = G) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(E, H, num_kv_heads=kv, rotary=RotaryEmbedding(D)).eval()


def _x(b: int = 2, n: int = P + STEPS, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, n, E, generator=torch.Generator().manual_seed(seed))


def _run_policy(mha: MultiHeadAttention, x: torch.Tensor, cache: PolicyKV) -> torch.Tensor:
    """The prompt in one call, then one position per call: every row's output ``(B, L, E)``."""
    outs = [mha(x[:, :P], is_causal=True, cache=cache, need_weights=False)[0]]
    for t in range(P, x.shape[1]):
        outs.append(mha(x[:, t : t + 1], cache=cache, need_weights=False)[0])
    return torch.cat(outs, 1)


def _full_call(mha: MultiHeadAttention, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """One call over every position with ``allowed`` ``(L, L)`` or ``(H, L, L)`` (True = may attend)."""
    mask = allowed if allowed.dim() == 2 else allowed[None]
    return mha(x, mask=mask, need_weights=False)[0]


def _window_mask(n: int, sinks: int, recent: int) -> torch.Tensor:
    """Rows of the prompt see their whole past; a later row t sees the sinks and the last ``recent`` keys before
    it, and itself (the budget's keys after the previous step's eviction, plus the new one)."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    causal = j <= i
    windowed = causal & ((j < sinks) | (j >= i - recent))
    return torch.where(i < P, causal, windowed)


def test_window_policy_equals_a_window_mask():
    mha, x = _mha(), _x()
    budget, sinks = 12, 4
    policy = make_policy("window", budget, sinks=sinks)
    got = _run_policy(mha, x, PolicyKV(policy.rules(0, G)))
    want = _full_call(mha, x, _window_mask(x.shape[1], sinks, budget - sinks))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_head_aware_equals_a_per_head_mask():
    mha, x = _mha(), _x()
    budget, sinks = 10, 2
    policy = make_policy("head-aware", budget, full_heads=[[1]], sinks=sinks)
    cache = PolicyKV(policy.rules(0, G))
    got = _run_policy(mha, x, cache)
    n = x.shape[1]
    causal = torch.ones(n, n).tril().bool()
    window = _window_mask(n, sinks, budget - sinks)
    per_head = torch.stack([window, window, causal, causal])  # kv head 0 -> query heads 0, 1; kv head 1 -> 2, 3
    torch.testing.assert_close(got, _full_call(mha, x, per_head), atol=1e-5, rtol=1e-5)
    # the streaming heads hold the budget, the retrieval head every key
    full_group, stream_group = cache.groups
    assert full_group.kv_heads == [1] and full_group.length == n
    assert stream_group.kv_heads == [0] and stream_group.length == budget
    # which keys each head holds, by position: head 0 the sinks and the latest, head 1 every key
    window_pos, every_pos = cache.positions()
    want = list(range(sinks)) + list(range(n - (budget - sinks), n))
    assert window_pos.tolist() == [want] * x.shape[0] and every_pos.tolist() == [list(range(n))] * x.shape[0]


def _qkv(mha: MultiHeadAttention, x: torch.Tensor):
    """Rotated q ``(B, H, L, D)``, k, v ``(B, G, L, D)`` of a full call (through the hook points)."""
    got = {}
    handles = [
        getattr(mha, f"hook_{n}").add_hook(lambda t, hook, n=n: got.__setitem__(n, t.detach().clone()))
        for n in ("q", "k", "v")
    ]
    mha(x, is_causal=True, need_weights=False)
    for h in handles:
        h.remove()
    return got["q"], got["k"], got["v"]


def _weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q . k / sqrt(D)) over the given keys, fp64: ``q`` ``(D,)``, ``k`` ``(N, D)``."""
    return torch.softmax((k.double() @ q.double()) / math.sqrt(q.shape[-1]), -1)


def _h2o_reference(q, k, v, heavy: int, recent: int):
    """H2O written with sets and dicts: per (row, kv head) the kept positions and their accumulated attention
    (summed over the group's query heads); returns each step's z ``(B, H, STEPS, D)`` and the final kept sets."""
    b, h, n, d = q.shape
    g = k.shape[1]
    r = h // g
    kept: dict[tuple[int, int], list[int]] = {}
    score: dict[tuple[int, int], dict[int, float]] = {}

    def evict(key):
        pos = sorted(kept[key])
        if len(pos) <= heavy + recent:
            return
        recent_part = pos[len(pos) - recent :]
        older = pos[: len(pos) - recent]
        heavy_part = sorted(older, key=lambda p: -score[key][p])[:heavy]
        kept[key] = sorted(heavy_part + recent_part)

    for bi in range(b):
        for gi in range(g):
            key = (bi, gi)
            score[key] = {j: 0.0 for j in range(P)}
            for hi in range(gi * r, gi * r + r):
                for i in range(P):
                    w = _weights(q[bi, hi, i], k[bi, gi, : i + 1])
                    for j in range(i + 1):
                        score[key][j] += float(w[j])
            kept[key] = list(range(P))
            evict(key)
    zs = torch.zeros(b, h, n - P, d, dtype=torch.float64)
    for t in range(P, n):
        for bi in range(b):
            for gi in range(g):
                key = (bi, gi)
                kept[key] = sorted(kept[key] + [t])
                score[key][t] = 0.0
                idx = torch.tensor(kept[key])
                for hi in range(gi * r, gi * r + r):
                    w = _weights(q[bi, hi, t], k[bi, gi, idx])
                    zs[bi, hi, t - P] = w @ v[bi, gi, idx].double()
                    for j, wj in zip(kept[key], w.tolist()):
                        score[key][j] += wj
                evict(key)
    return zs, kept


def test_h2o_keeps_the_largest_accumulated_attention():
    mha, x = _mha(3), _x(seed=4)
    budget = 10
    policy = make_policy("h2o", budget)
    assert policy.rule == HeavyHitters(5, 5)
    cache = PolicyKV(policy.rules(0, G))
    zs = []
    handle = mha.hook_z.add_hook(lambda t, hook: zs.append(t.detach().clone()))
    _run_policy(mha, x, cache)
    handle.remove()
    q, k, v = _qkv(mha, x)
    want_z, want_kept = _h2o_reference(q, k, v, heavy=5, recent=5)
    got_z = torch.cat(zs[1:], 2)  # the steps (the prompt's z is the full causal call)
    torch.testing.assert_close(got_z.double(), want_z, atol=1e-5, rtol=1e-5)
    pos = cache.groups[0].pos
    for (bi, gi), kept in want_kept.items():
        assert pos[bi, gi].tolist() == kept


def _snapkv_scores(q, k, bi: int, gi: int, window: int, kernel: int) -> list[float]:
    """SnapKV's score of each prompt key before the observation window (row ``bi``, kv head ``gi``): the window's
    attention summed over its queries, pooled over ``kernel`` neighbours, summed over the group's heads."""
    r = q.shape[1] // G
    m = P - window
    summed = [0.0] * m
    for hi in range(gi * r, gi * r + r):
        per_head = [0.0] * P
        for i in range(P - window, P):
            w = _weights(q[bi, hi, i], k[bi, gi, : i + 1])
            for j in range(i + 1):
                per_head[j] += float(w[j])
        for j in range(m):  # pooled over `kernel` neighbours (zero padding counted, as avg_pool1d does)
            near = [per_head[c] if 0 <= c < m else 0.0 for c in range(j - kernel // 2, j + kernel // 2 + 1)]
            summed[j] += sum(near) / kernel
    return summed


def test_snapkv_keeps_what_the_observation_window_attends_to():
    mha, x = _mha(5), _x(seed=6, n=P + 2)
    budget, window, kernel = 9, 4, 3
    cache = PolicyKV([(list(range(G)), SnapKV(budget, window, kernel))])
    mha(x[:, :P], is_causal=True, cache=cache, need_weights=False)
    q, k, _ = _qkv(mha, x[:, :P])
    for bi in range(q.shape[0]):
        for gi in range(G):
            summed = _snapkv_scores(q, k, bi, gi, window, kernel)
            older = sorted(range(P - window), key=lambda j: -summed[j])[: budget - window]
            want = sorted(older) + list(range(P - window, P))
            assert cache.groups[0].pos[bi, gi].tolist() == want
    # generated keys are all kept (the paper compresses the prompt once)
    mha(x[:, P : P + 1], cache=cache, need_weights=False)
    mha(x[:, P + 1 : P + 2], cache=cache, need_weights=False)
    assert cache.groups[0].length == budget + 2


@torch.no_grad()
def test_adakv_shares_the_layer_budget_by_one_ranking_over_its_heads():
    mha, x = _mha(11), _x(seed=12, n=P + 2)
    budget, window, kernel, floor = 8, 2, 3, 0.5
    policy = make_policy("adakv", budget, window=window, kernel=kernel, floor=floor)
    assert policy == AdaKV(budget, window, kernel, floor)
    cache = policy.layer_cache(0, G, 1, None)
    mha(x[:, :P], is_causal=True, cache=cache, need_weights=False)
    q, k, _ = _qkv(mha, x[:, :P])
    want: dict[tuple[int, int], list[int]] = {}
    for bi in range(q.shape[0]):
        entries = []  # (score, head, position) over every head of the layer
        for gi in range(G):
            score = _snapkv_scores(q, k, bi, gi, window, kernel) + [math.inf] * window  # the window stays
            for j in sorted(range(P), key=lambda j: -score[j])[: int(budget * floor)]:  # each head's floor
                score[j] = math.inf
            entries += [(score[j], gi, j) for j in range(P)]
        chosen = sorted(entries, key=lambda e: -e[0])[: G * budget]  # one ranking, the layer's whole budget
        for gi in range(G):
            want[(bi, gi)] = sorted(j for _, g, j in chosen if g == gi)
    assert len({len(w) for w in want.values()}) > 1  # the heads really keep different numbers of keys here
    for grp in cache.groups:  # one group per key/value head, each in buffers of its own length
        (gi,) = grp.kv_heads
        most = max(len(want[(bi, gi)]) for bi in range(q.shape[0]))
        assert grp.length == most and grp.buffers._k.shape[2] == most + 1  # the kept keys + one step's room
        for bi in range(q.shape[0]):  # each row keeps its own best keys: at least those Ada-KV keeps for it
            assert set(want[(bi, gi)]) <= set(grp.pos[bi, 0].tolist())
    row = make_policy("adakv", budget, window=window, kernel=kernel, floor=floor).layer_cache(0, G, 1, None)
    mha(x[:1, :P], is_causal=True, cache=row, need_weights=False)  # one row: exactly Ada-KV's keys, the budget's bytes
    assert {grp.kv_heads[0]: grp.pos[0, 0].tolist() for grp in row.groups} == {g: want[(0, g)] for g in range(G)}
    assert row.kv_nbytes() == G * budget * D * 2 * 4
    for t in range(P, P + 2):  # generated keys are all kept
        mha(x[:1, t : t + 1], cache=row, need_weights=False)
    assert row.kv_nbytes() == (G * budget + 2 * G) * D * 2 * 4


def _turned(p: float, theta: torch.Tensor) -> torch.Tensor:
    """The rotary matrix ``(D, D)`` of position ``p`` ("rotate half": pairs ``(i, i + D/2)``), in fp64."""
    d = 2 * theta.shape[0]
    r = torch.zeros(d, d, dtype=torch.float64)
    for i, t in enumerate(theta.tolist()):
        c, s = math.cos(p * t), math.sin(p * t)
        r[i, i], r[i, i + d // 2], r[i + d // 2, i], r[i + d // 2, i + d // 2] = c, -s, s, c
    return r


@torch.no_grad()
def test_expected_attention_keeps_what_the_modelled_future_queries_attend_to():
    mha, x = _mha(13), _x(b=1, seed=14, n=P + 1)
    size, future, sinks = 9, 16, 2
    policy = make_policy("expected", size, future=future, sinks=sinks)
    cache = policy.layer_cache(0, G, 1, None)
    mha(x[:, :P], is_causal=True, cache=cache, need_weights=False)
    q, k, v = (t.double()[0] for t in _qkv(mha, x[:, :P]))  # rotated at their positions
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    raw = torch.stack([q[:, t] @ _turned(t, theta) for t in range(P)], 1)  # (H, P, D): R(t)' q, unrotated
    assert torch.allclose(torch.stack([raw[:, t] @ _turned(t, theta).T for t in range(P)], 1), q)
    later = sum(_turned(p, theta) for p in range(P, P + future)) / future  # the average turn of what comes
    r = H // G
    for gi in range(G):
        score = torch.zeros(P - sinks, dtype=torch.float64)
        for hi in range(gi * r, gi * r + r):
            qs = raw[hi, sinks:]  # (n, D): the queries after the sinks, before rotation
            mu = later @ qs.mean(0)
            cov = later @ ((qs - qs.mean(0)).T @ (qs - qs.mean(0)) / qs.shape[0]) @ later.T
            keys = k[gi, sinks:]
            logits = keys @ mu / math.sqrt(D) + torch.einsum("ni,ij,nj->n", keys, cov, keys) / (2 * D)
            score += torch.softmax(logits, 0) / r
        score *= v[gi, sinks:].norm(dim=-1)
        best = (score.argsort(descending=True)[: size - sinks] + sinks).tolist()
        assert cache.groups[0].pos[0, gi].tolist() == list(range(sinks)) + sorted(best)
    norm_only = sorted((-k[gi].norm(dim=-1)).argsort()[:size].tolist())  # not a key-norm rule in disguise
    assert cache.groups[0].pos[0, gi].tolist() != norm_only
    mha(x[:, P : P + 1], cache=cache, need_weights=False)  # generated keys are all kept
    assert cache.groups[0].length == size + 1


@torch.no_grad()
def test_the_streaming_policy_is_the_streaming_cache():
    model = _lm()
    ids = torch.randint(0, 60, (1, P + STEPS), generator=torch.Generator().manual_seed(7))

    def stream(cache):  # one token a step, as a stream is read
        return torch.cat([model(ids[:, t : t + 1], cache=cache) for t in range(ids.shape[1])], 1)

    cache = model.new_cache(policy="streaming", budget=8, sinks=2)
    assert isinstance(cache.self_attn[0], StreamingKV) and cache.rolling
    assert model.new_cache(policy="window", budget=8, sinks=2).policy == SinksWindow(2, 6)  # sinks= is the policy's
    got = stream(cache)
    assert torch.equal(got, stream(model.new_cache(window=6, sinks=2)))
    # the same keys at their positions in the text (the window policy) give other logits once keys are evicted
    assert not torch.allclose(got[:, 8:], stream(model.new_cache(policy="window", budget=8, sinks=2))[:, 8:])
    # generate reads a prompt longer than the cache as the stream above: what fills it, then a token at a time
    tokens = generate(model, ids[:, :20], max_new_tokens=4, kv_policy="streaming", kv_budget=8).tokens[0]
    assert tokens[0] == int(stream(model.new_cache(policy="streaming", budget=8))[0, 19].argmax())
    with pytest.raises(ValueError, match="cannot be applied to a prompt read at its positions"):
        model.new_cache(policy="streaming", budget=8, record=True)
    recorded = model.new_cache(record=True)
    model(ids[:, :P], cache=recorded)
    with pytest.raises(ValueError, match="policy='window'"):
        recorded.compress(make_policy("streaming", 8))


def _kept_by(score_of, q, k, budget: int) -> dict:
    """Per (row, kv head), the positions kept after the prompt and every step when each call keeps the ``budget``
    keys with the largest ``score_of(bi, gi, t, keys) -> {key: score}`` (t: the call's last query), written with
    lists and dicts."""
    kept = {}
    for bi in range(q.shape[0]):
        for gi in range(G):
            keys: list[int] = []
            for t in range(P - 1, q.shape[2]):  # the prompt (its last query decides), then each step
                keys = list(range(P)) if t == P - 1 else [*keys, t]
                if len(keys) > budget:
                    score = score_of(bi, gi, t, keys)
                    keys = sorted(sorted(keys, key=lambda j: -score[j])[:budget])
            kept[(bi, gi)] = keys
    return kept


def test_tova_keeps_what_the_last_query_attends_to():
    mha, x = _mha(7), _x(seed=8)
    budget = 9
    cache = PolicyKV(make_policy("tova", budget).rules(0, G))
    _run_policy(mha, x, cache)
    q, k, _ = _qkv(mha, x)
    r = H // G

    def score(bi, gi, t, keys):  # the last query's weights over the kept keys, summed over the group's heads
        total = dict.fromkeys(keys, 0.0)
        for hi in range(gi * r, gi * r + r):
            for j, w in zip(keys, _weights(q[bi, hi, t], k[bi, gi, keys])):
                total[j] += float(w)
        return total

    for (bi, gi), want in _kept_by(score, q, k, budget).items():
        assert cache.groups[0].pos[bi, gi].tolist() == want


def test_layer_tova_keeps_what_the_last_query_attends_to_averaged_over_every_head():
    """TOVA as its authors' code and kvpress score: the last query's weights averaged over all the layer's query
    heads, so every key/value head keeps the same keys."""
    mha, x = _mha(7), _x(seed=8)
    budget = 9
    cache = PolicyKV(make_policy("tova-layer", budget).rules(0, G))
    _run_policy(mha, x, cache)
    q, k, _ = _qkv(mha, x)
    r = H // G

    def score(bi, gi, t, keys):  # every query head's weights over its own key/value head's keys at these positions
        total = dict.fromkeys(keys, 0.0)
        for hi in range(H):
            for j, w in zip(keys, _weights(q[bi, hi, t], k[bi, hi // r, keys])):
                total[j] += float(w)
        return total

    kept = _kept_by(score, q, k, budget)
    for (bi, gi), want in kept.items():
        assert cache.groups[0].pos[bi, gi].tolist() == want
    assert all(kept[(bi, 0)] == kept[(bi, gi)] for bi, gi in kept)


def test_knorm_keeps_the_keys_of_smallest_norm():
    mha, x = _mha(9), _x(seed=10)
    budget = 7
    cache = PolicyKV(make_policy("knorm", budget).rules(0, G))
    _run_policy(mha, x, cache)
    _, k, _ = _qkv(mha, x)

    def score(bi, gi, t, keys):
        return {j: -float(k[bi, gi, j].double().norm()) for j in keys}

    for (bi, gi), want in _kept_by(score, k.new_zeros(k.shape[0], H, k.shape[2], 1), k, budget).items():
        assert cache.groups[0].pos[bi, gi].tolist() == want


def test_pyramidkv_budgets_fall_with_depth_as_the_paper_computes_them():
    policy = make_policy("pyramidkv", 64)
    assert policy == PyramidKV(64, 20, 32, 7)
    layers = 4
    sizes = [policy.rules(i, G, layers)[0][1].size for i in range(layers)]
    extra = 64 - 32  # the paper's code: min = extra // beta, max = 2 * extra - min, equal steps between
    low, high = extra // 20, 2 * extra - extra // 20
    step = (high - low) // (layers - 1)
    assert sizes == [32 + high - i * step for i in range(layers)] == [95, 75, 55, 35]
    assert all(isinstance(r, SnapKV) for i in range(layers) for _, r in policy.rules(i, G, layers))
    assert make_policy("pyramidkv", 20).rules(0, G, layers)[0][1].size == 20  # within the window: uniform
    model = _lm()
    ids = torch.randint(0, 60, (1, P + 2), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(policy=make_policy("pyramidkv", 16, window=4))
    model(ids[:, :P], cache=cache)
    # 2 layers, budget 16, window 4: 12 past the window -> 24 and 0 of them: 28 keys (all 24 of the prompt) and 4
    assert [layer.groups[0].length for layer in cache.self_attn] == [P, 4]


def _lm(**decoder) -> CausalLM:
    torch.manual_seed(0)
    dec = dict(d_model=E, num_heads=H, num_layers=2, cross_attention=False, norm_first=True, dropout=0.0)
    dec.update(decoder)
    dec.setdefault("attention", {"num_kv_heads": G})
    return CausalLM(CausalLMConfig(vocab_size=60, max_len=256, positional="rope", decoder=DecoderConfig(**dec))).eval()


def _decode(model: CausalLM, ids: torch.Tensor, cache) -> torch.Tensor:
    """Logits of the prompt's last position and of every step after it ``(B, 1 + steps, V)``."""
    out = [model(ids[:, :P], cache=cache)[:, -1:]]
    for t in range(P, ids.shape[1]):
        out.append(model(ids[:, t : t + 1], cache=cache))
    return torch.cat(out, 1)


@torch.no_grad()
def test_full_policy_is_todays_cache_exactly():
    model = _lm()
    ids = torch.randint(0, 60, (2, P + STEPS), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_decode(model, ids, model.new_cache()), _decode(model, ids, model.new_cache(policy="full")))
    before = generate(model, ids[:, :P], max_new_tokens=12).tokens
    assert generate(model, ids[:, :P], max_new_tokens=12, kv_policy="full").tokens == before


@torch.no_grad()
@pytest.mark.parametrize(
    "name", ["window", "h2o", "snapkv", "head-aware", "tova", "knorm", "pyramidkv", "adakv", "expected"]
)
def test_recorded_prompt_compressed_equals_a_prefill_under_the_policy(name):
    model = _lm()
    ids = torch.randint(0, 60, (1, P + 4), generator=torch.Generator().manual_seed(1))
    options = {"full_heads": [[0], [1]]} if name == "head-aware" else {}
    direct = model.new_cache(policy=name, budget=12, **options)
    model(ids[:, :P], cache=direct)
    recorded = model.new_cache(record=True)
    model(ids[:, :P], cache=recorded)
    squeezed = recorded.compress(direct.policy)
    for a, b in zip(direct.self_attn, squeezed.self_attn):
        for ga, gb in zip(a.groups, b.groups):
            assert torch.equal(ga.pos, gb.pos) and torch.equal(ga.buffers.k, gb.buffers.k)
    for t in range(P, P + 4):
        assert torch.equal(model(ids[:, t : t + 1], cache=direct), model(ids[:, t : t + 1], cache=squeezed))
    assert recorded.self_attn[0].length == P  # the recording is left whole for the next policy


@torch.no_grad()
def test_recorded_prompt_under_the_full_policy_decodes_as_the_plain_cache():
    model = _lm()
    ids = torch.randint(0, 60, (1, P + 4), generator=torch.Generator().manual_seed(5))
    plain = model.new_cache()
    model(ids[:, :P], cache=plain)
    recorded = model.new_cache(record=True)
    model(ids[:, :P], cache=recorded)
    squeezed = recorded.compress(make_policy("full"))
    for t in range(P, P + 4):
        assert torch.equal(model(ids[:, t : t + 1], cache=plain), model(ids[:, t : t + 1], cache=squeezed))
    assert recorded.self_attn[0].length == P and squeezed.self_attn[0].length == P + 4


@torch.no_grad()
def test_evicted_memory_is_released():
    model = _lm()
    ids = torch.randint(0, 60, (1, 200), generator=torch.Generator().manual_seed(2))
    full = model.new_cache()
    model(ids, cache=full)
    for name in ("window", "h2o"):
        cache = model.new_cache(policy=name, budget=16)
        model(ids[:, :150], cache=cache)
        for t in range(150, 200):
            model(ids[:, t : t + 1], cache=cache)
        for layer in cache.self_attn:
            (grp,) = layer.groups
            assert grp.buffers._k.shape[2] == 17 and grp.buffers._v.shape[2] == 17  # the budget + one step's room
            assert grp.length == 16
        per_key = 2 * G * D * 4  # a key and a value of every kv head, fp32
        assert cache.kv_nbytes() == 2 * 16 * per_key  # two layers
        assert full.kv_nbytes() == 2 * 200 * per_key
        assert cache.nbytes() < full.nbytes() / 5


@torch.no_grad()
def test_budget_edges():
    model = _lm()
    ids = torch.randint(0, 60, (1, P + 3), generator=torch.Generator().manual_seed(3))
    for name in ("window", "h2o", "snapkv", "head-aware"):
        with pytest.raises(ValueError, match="budget of at least"):
            model.new_cache(policy=name, budget=0, **({"full_heads": [[0], [1]]} if name == "head-aware" else {}))
    with pytest.raises(ValueError, match="budget of at least 5"):
        model.new_cache(policy="window", budget=4)  # no room for a recent key after the 4 sinks
    with pytest.raises(ValueError, match="unknown KV policy 'lru'.*h2o"):
        model.new_cache(policy="lru", budget=8)
    # budget 1: only the newest key is kept (H2O with no heavy hitters)
    one = model.new_cache(policy="h2o", budget=1)
    model(ids[:, :P], cache=one)
    assert [layer.groups[0].pos.tolist() for layer in one.self_attn] == [[[[P - 1]] * G]] * 2
    # a budget above the context keeps everything: the same logits as the full cache
    for name in ("window", "h2o", "snapkv"):
        big = _decode(model, ids, model.new_cache(policy=name, budget=10 * ids.shape[1]))
        torch.testing.assert_close(big, _decode(model, ids, model.new_cache()), atol=1e-5, rtol=1e-5)


def test_refusals_name_the_fix():
    model = _lm()
    ids = torch.randint(1, 60, (2, P))
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[0, :3] = False
    cache = model.new_cache(policy="h2o", budget=8)
    with pytest.raises(ValueError, match="unpadded rows"):
        model(ids, keep, cache=cache)
    seq = Seq2Seq(Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=20)).eval()
    with pytest.raises(ValueError, match="decoder-only"):
        generate(seq, torch.randint(1, 20, (1, 5)), kv_policy="h2o", kv_budget=8)
    with pytest.raises(ValueError, match="names key/value heads \\[5\\] in layer 0, which has 2"):
        model(ids[:1], cache=model.new_cache(policy="head-aware", budget=8, full_heads=[[5], [0]]))
    with pytest.raises(ValueError, match="classify the heads"):
        model(ids[:1], cache=model.new_cache(policy="head-aware", budget=8, full_heads=[[0]]))
    with pytest.raises(ValueError, match="policy='streaming'"):
        model.new_cache(policy="h2o", window=8)
    alibi = CausalLM(
        CausalLMConfig(
            vocab_size=20, positional="alibi", decoder=DecoderConfig(d_model=16, num_heads=2, cross_attention=False)
        )
    )
    with pytest.raises(ValueError, match="ALiBi"):
        alibi.new_cache(policy="window", budget=8)


def test_split_layers_refuse_a_single_map():
    mha, x = _mha(), _x()
    policy = make_policy("head-aware", 8, full_heads=[[0]])
    cache = PolicyKV(policy.rules(0, G))
    with pytest.raises(ValueError, match="no single attention map"):
        mha(x[:, :P], is_causal=True, cache=cache, need_weights=True)


@torch.no_grad()
def test_sliding_window_layers_keep_only_their_window():
    w = 8
    model = _lm(num_layers=4, sliding_window=w, global_every=2)  # layers 0, 2 local; 1, 3 global
    ids = torch.randint(0, 60, (1, P + STEPS), generator=torch.Generator().manual_seed(4))
    want = _decode(model, ids, model.new_cache())
    for name, budget in (("full", None), ("h2o", 64)):
        cache = model.new_cache(policy=name, budget=budget)
        torch.testing.assert_close(_decode(model, ids, cache), want, atol=1e-5, rtol=1e-5)
        assert [layer.length for layer in cache.self_attn][::2] == [w - 1, w - 1]
    # a budget below the context: the global layers evict by their rule, the local ones keep their window
    squeezed = model.new_cache(policy="h2o", budget=6)
    _decode(model, ids, squeezed)
    assert [layer.length for layer in squeezed.self_attn] == [w - 1, 6, w - 1, 6]
    # a chunk of several positions after decoding steps: its band mask is built from the kept keys' positions
    chunked = model.new_cache(policy="full")
    model(ids[:, :P], cache=chunked)
    model(ids[:, P : P + 1], cache=chunked)
    got = model(ids[:, P + 1 : P + 6], cache=chunked)
    torch.testing.assert_close(got, model(ids[:, : P + 6])[:, P + 1 :], atol=1e-5, rtol=1e-5)


def test_registry_and_rules():
    assert sorted(KV_POLICIES) == [
        *("adakv", "expected", "full", "h2o", "head-aware", "knorm", "pyramidkv", "snapkv", "streaming", "tova"),
        "tova-layer",
        "window",
    ]
    assert make_policy("tova", 8) == TOVA(8) and make_policy("knorm", 8) == KeyNorm(8)
    assert make_policy("window", 20).rule == SinksWindow(4, 16)
    with pytest.raises(ValueError, match="sinks >= 0"):
        SinksWindow(-1, 3)


@torch.no_grad()
def test_a_new_policy_is_one_class_in_one_place():
    """A policy written here, registered, is served by the cache, the model and the recorded-prompt path."""
    from multihead.modules.kv import KVPolicy, register

    @register
    @dataclass(frozen=True)
    class Oldest(KVPolicy):  # the first `size` keys, whatever comes later
        name: ClassVar[str] = "oldest-for-a-test"
        size: int = 4

        @classmethod
        def of_budget(cls, budget=None):
            return cls(budget)

        def keep(self, pos, score, *, prompt):
            return None if pos.shape[-1] <= self.size else pos[..., : self.size].argsort(-1)[..., : self.size]

    try:
        model = _lm()
        ids = torch.randint(0, 60, (1, P + 3), generator=torch.Generator().manual_seed(4))
        cache = model.new_cache(policy="oldest-for-a-test", budget=5)
        _decode(model, ids, cache)
        assert all(layer.groups[0].pos[0, 0].tolist() == [0, 1, 2, 3, 4] for layer in cache.self_attn)
        recorded = model.new_cache(record=True)
        model(ids[:, :P], cache=recorded)
        squeezed = recorded.compress(make_policy("oldest-for-a-test", 5))
        assert squeezed.self_attn[0].groups[0].pos[0, 0].tolist() == [0, 1, 2, 3, 4]
    finally:
        KV_POLICIES.pop("oldest-for-a-test")


def test_policy_arguments_are_checked_where_they_are_made():
    """Bad options are refused when the policy is made, with the fix, never deep inside torch or ignored."""
    with pytest.raises(ValueError, match="observation window .* at least 1, got window=-3"):
        make_policy("snapkv", 16, window=-3)
    with pytest.raises(ValueError, match="full_heads is a list with one list .* got str '0,1'"):
        make_policy("head-aware", 16, full_heads="0,1")
    with pytest.raises(ValueError, match="layer 1 names 'x', not a head index"):
        make_policy("head-aware", 16, full_heads=[[0], ["x"]])
    with pytest.raises(ValueError, match="full policy keeps every key and takes no budget \\(got 5\\)"):
        make_policy("full", 5)
    with pytest.raises(ValueError, match="the h2o policy takes no option window; it takes only a budget"):
        make_policy("h2o", 16, window=4)
    assert make_policy("full").full


def test_a_split_for_another_model_is_refused_on_the_python_path():
    """generate(..., kv_policy=<a split of 3 layers>) on a 2-layer model: refused before any token, as on the CLI."""
    model = _lm()
    ids = torch.randint(1, 60, (1, P))
    policy = make_policy("head-aware", 16, full_heads=[[0], [1], [0]])
    with pytest.raises(ValueError, match="split names 3 layers; this model has 2"):
        generate(model, ids, kv_policy=policy, max_new_tokens=2)
    recorded = model.new_cache(record=True)
    model(ids, cache=recorded)
    with pytest.raises(ValueError, match="split names 3 layers; this model has 2"):
        recorded.compress(policy)


@pytest.mark.parametrize(
    ("name", "option", "value"),
    [
        ("window", "sinks", True),
        ("head-aware", "sinks", False),
        ("streaming", "sinks", 4.0),
        ("snapkv", "window", True),
        ("snapkv", "kernel", 3.0),
        ("pyramidkv", "beta", "20"),
        ("adakv", "window", None),
        ("expected", "future", True),
    ],
)
def test_every_whole_number_option_refuses_bools_and_others(name, option, value):
    """``sinks=True`` was read as 1 where a budget refuses a bool: every whole-number option refuses it by name."""
    extra = {"full_heads": [[0], [1]]} if name == "head-aware" else {}
    with pytest.raises(ValueError, match=f"the {name} policy's {option} is a whole number"):
        make_policy(name, 16, **{option: value}, **extra)
    assert make_policy("window", 16, sinks=0).sinks == 0


@pytest.mark.parametrize("policy", [None, "h2o"])
def test_a_cache_made_for_another_model_is_refused_by_name(policy):
    """A 2-layer model's cache handed to a 3-layer model failed with an IndexError; the other way round, the lean
    step zipped the layers with the cache's and decoded the model's first layers only, silently. Both refused."""
    from multihead.modules import fastpath

    two, three = _lm(), _lm(num_layers=3)
    ids = torch.randint(0, 60, (1, P), generator=torch.Generator().manual_seed(5))
    kw = {"policy": policy, "budget": 8} if policy else {}
    for model, other in ((three, two), (two, three)):
        with torch.no_grad(), pytest.raises(ValueError, match="made for another model; make one with model.new_cache"):
            logits, cache = model.prefill(ids, cache=other.new_cache(**kw))
        with torch.no_grad():  # a cache filled by its own model, then stepped by the other
            logits, cache = other.prefill(ids, cache=other.new_cache(**kw))
            assert fastpath.ENABLED
            with pytest.raises(ValueError, match="made for another model"):
                model.step(logits.argmax(-1), cache)


@torch.no_grad()
@pytest.mark.parametrize("name", ["h2o", "tova", "knorm", "window"])
def test_a_prompt_only_policy_on_a_native_lm_evicts_once_then_keeps_every_step(name):
    model = _lm()
    ids = torch.randint(0, 60, (2, P + STEPS), generator=torch.Generator().manual_seed(0))
    budget = P // 2
    once = model.new_cache(policy=name, budget=budget, prompt_only=True)
    got = _decode(model, ids, once)
    assert [kv.length for kv in once.self_attn] == [budget + STEPS] * len(once.self_attn)  # nothing evicted after
    recorded = model.new_cache(record=True)
    first = model(ids[:, :P], cache=recorded)[:, -1:]
    kept = recorded.compress(make_policy(name, budget), prompt_only=True)  # the same from one recorded prompt
    steps = [model(ids[:, t : t + 1], cache=kept) for t in range(P, ids.shape[1])]
    torch.testing.assert_close(torch.cat([first, *steps], 1), got)
    always = model.new_cache(policy=name, budget=budget)  # by default the budget holds at every step
    _decode(model, ids, always)
    assert [kv.length for kv in always.self_attn] == [budget] * len(always.self_attn)


@torch.no_grad()
@pytest.mark.parametrize(
    ("policy", "budget", "options"),
    [
        ("h2o", 8, {}),
        ("snapkv", 12, {}),
        ("adakv", 12, {}),
        ("head-aware", 8, {"full_heads": [[0], [1]]}),
        ("streaming", 28, {}),
    ],
)
def test_a_policy_cache_reorders_its_rows_with_the_keys_each_kept(policy, budget, options):
    """Beam search keeps each surviving beam's parent row: after reorder, every row decodes exactly as a cache that
    read that row's prompt itself (its own kept keys, positions and scores went with it)."""
    model = _lm()
    ids = torch.randint(0, 60, (2, P + STEPS), generator=torch.Generator().manual_seed(5))
    rows = torch.tensor([1, 0, 1])
    cache = model.new_cache(policy=policy, budget=budget, **options)
    model(ids[:, :P], cache=cache)
    model(ids[:, P : P + 1], cache=cache)  # one step before the reorder: scores that carry over go with the rows
    cache.reorder(rows)
    moved = _decode_from(model, ids[rows], cache, P + 1)
    direct = model.new_cache(policy=policy, budget=budget, **options)
    model(ids[rows, :P], cache=direct)
    model(ids[rows, P : P + 1], cache=direct)
    # the same numbers up to the order of additions: a reordered buffer can take another kernel path on some CPUs
    torch.testing.assert_close(moved, _decode_from(model, ids[rows], direct, P + 1), rtol=1e-6, atol=1e-6)


def _decode_from(model: CausalLM, ids: torch.Tensor, cache, start: int) -> torch.Tensor:
    return torch.cat([model(ids[:, t : t + 1], cache=cache) for t in range(start, ids.shape[1])], 1)


@torch.no_grad()
def test_beam_search_under_a_policy_whose_budget_keeps_everything_is_beam_search():
    model = _lm()
    ids = torch.randint(0, 60, (2, P), generator=torch.Generator().manual_seed(6))
    plain = generate(model, ids, strategy="beam", num_beams=3, max_new_tokens=8)
    for name in ("h2o", "snapkv", "tova"):
        kept = generate(model, ids, strategy="beam", num_beams=3, max_new_tokens=8, kv_policy=name, kv_budget=4 * P)
        assert kept.tokens == plain.tokens and kept.scores == pytest.approx(plain.scores, abs=1e-5)
    one = generate(model, ids, strategy="beam", num_beams=1, max_new_tokens=8, kv_policy="h2o", kv_budget=8)
    assert one.tokens == generate(model, ids, max_new_tokens=8, kv_policy="h2o", kv_budget=8).tokens


@torch.no_grad()
def test_a_recording_of_what_some_policies_read_serves_them_as_a_whole_recording_does():
    """new_cache(record=[policies]) records only what those read (no whole attention map unless one needs it): each
    compresses to the same cache as from a recording of everything; a policy it did not record for is refused."""
    model = _lm()
    ids = torch.randint(0, 60, (1, P + STEPS), generator=torch.Generator().manual_seed(8))
    whole, some = model.new_cache(record=True), model.new_cache(record=[SnapKV, TOVA, KeyNorm])
    model(ids[:, :P], cache=whole)
    model(ids[:, :P], cache=some)
    assert None in whole.self_attn[0].recorded and None not in some.self_attn[0].recorded
    for name in ("snapkv", "tova", "knorm"):
        policy = make_policy(name, 8)
        assert torch.equal(
            _decode_from(model, ids, whole.compress(policy), P), _decode_from(model, ids, some.compress(policy), P)
        )
    with pytest.raises(ValueError, match="the last 32, the last 1; this policy reads that of every query: record it"):
        some.compress(make_policy("h2o", 8))


@torch.no_grad()
@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "adakv"])
def test_a_recording_for_a_policy_with_its_own_window_serves_it(name):
    """A policy that reads a query window other than its class's default records that window: recorded for the
    instance, it compresses as a prefill under it does; a recording of the defaults refuses it, naming the fix."""
    model = _lm()
    ids = torch.randint(0, 60, (1, P + 4), generator=torch.Generator().manual_seed(11))
    policy = make_policy(name, 12, window=4)
    assert policy.observes == (4,) and type(policy).observes == (32,)
    direct = model.new_cache(policy=policy)
    model(ids[:, :P], cache=direct)
    recorded = model.new_cache(record=[policy])
    model(ids[:, :P], cache=recorded)
    squeezed = recorded.compress(policy)
    for t in range(P, P + 4):
        assert torch.equal(model(ids[:, t : t + 1], cache=direct), model(ids[:, t : t + 1], cache=squeezed))
    defaults = model.new_cache(record=True)
    model(ids[:, :P], cache=defaults)
    with pytest.raises(ValueError, match=r"reads that of the last 4: record it \(new_cache\(record=\[policy\]\)"):
        defaults.compress(policy)
