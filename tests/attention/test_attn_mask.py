"""The structured mask: parts kept apart down to the kernel that runs them, densified once for the others, validated
once per call, every part equal to a formula written here on every backend (and on random masks, hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.attention import AttnMask, masks
from multihead.attention.attn_mask import split_parts
from multihead.attention.patterns import SparsePattern

# every exact backend that runs dense masks with gradients on CPU (flex: tests/attention/test_flex.py)
EXACT = sorted(
    n
    for n, b in mh.list_backends().items()
    if b.capabilities.exact and "tensor" in b.capabilities.mask_parts and "cpu" in b.capabilities.backward_devices
)


def formula(q, k, v, allowed):
    """softmax(q k^T / sqrt(d)) v in fp64 under bool ``allowed`` (broadcastable); rows with no key -> 0."""
    h = q.shape[1]
    k, v = k.double().repeat_interleave(h // k.shape[1], 1), v.double().repeat_interleave(h // v.shape[1], 1)
    s = (q.double() @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def allowed_by_hand(b, lq, lk, keep=None, causal=False, offset=None, tensor=None, window=None):
    """The mask's meaning, written out: every part must allow the key."""
    out = torch.ones(b, 1, lq, lk, dtype=torch.bool)
    i = torch.arange(lq)[:, None]
    j = torch.arange(lk)[None, :]
    if keep is not None:
        out = out & keep[:, None, None, :]
    if causal:
        out = out & (j <= i + (lk - lq if offset is None else offset))
    if window is not None:
        out = out & ((i - j).abs() <= window)
    if tensor is not None:
        out = out & tensor
    return out


def qkv(b=2, h=4, g=2, lq=9, lk=9, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, lq, d, generator=gen, dtype=torch.float64),
        torch.randn(b, g, lk, d, generator=gen, dtype=torch.float64),
        torch.randn(b, g, lk, d, generator=gen, dtype=torch.float64),
    )


CASES = {
    # name: (lq, lk, AttnMask fields)  -- key padding: batch 1 keeps 3 keys
    "padding": (9, 9, dict(key_padding=True)),
    "padding-causal": (9, 9, dict(key_padding=True, causal=True)),
    "left-padding-causal": (9, 9, dict(key_padding="left", causal=True)),  # first rows of batch 1 see nothing
    "kv-cache": (3, 11, dict(causal=True)),  # bottom right: the queries are the last 3 positions
    "static-cache": (3, 16, dict(causal=True, causal_offset=5)),  # buffer of 16, 5 filled before these queries
    "long-queries": (12, 7, dict(causal=True)),  # first 5 rows see nothing
    "tensor-causal-padding": (9, 9, dict(key_padding=True, causal=True, tensor=True)),
    "empty-sequence": (9, 9, dict(key_padding="none")),  # batch 1 has no real key at all
    "window-padding": (9, 9, dict(key_padding=True, pattern=SparsePattern(window=2))),
}


def build(name, b=2):
    lq, lk, spec = CASES[name]
    spec = dict(spec)
    keep = None
    if spec.get("key_padding") is True:
        keep = torch.arange(lk)[None, :] < torch.tensor([lk, 3])[:, None]
    elif spec.get("key_padding") == "left":
        keep = torch.arange(lk)[None, :] >= torch.tensor([0, lk - 3])[:, None]
    elif spec.get("key_padding") == "none":
        keep = torch.stack([torch.ones(lk, dtype=torch.bool), torch.zeros(lk, dtype=torch.bool)])
    spec["key_padding"] = keep
    tensor = None
    if spec.get("tensor"):
        tensor = torch.rand(b, 1, lq, lk, generator=torch.Generator().manual_seed(1)) > 0.3
        spec["tensor"] = tensor
    window = spec["pattern"].window if "pattern" in spec else None
    am = AttnMask(**spec)
    hand = allowed_by_hand(b, lq, lk, keep, spec.get("causal", False), spec.get("causal_offset"), tensor, window)
    return lq, lk, am, hand


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_part_on_every_backend_equals_the_formula(backend, name):
    lq, lk, am, hand = build(name)
    q, k, v = qkv(lq=lq, lk=lk)
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = mh.attention(*ts, mask=am, backend=backend)
    expected = formula(q, k, v, hand)
    assert (out - expected).abs().max().item() < 1e-10
    assert torch.equal(am.dense(lq, lk).expand_as(hand), hand.expand(2, 1, lq, lk))  # dense() says the same
    out.sum().backward()
    empty = ~hand.any(-1)  # (b, 1, i): rows with no key have zero output and zero query gradient
    assert torch.all(out.detach()[empty.expand(2, 4, lq)] == 0)
    assert torch.all(ts[0].grad[empty.expand(2, 4, lq)] == 0)
    assert all(torch.isfinite(t.grad).all() for t in ts)


@pytest.mark.parametrize("name", ["padding", "padding-causal", "window-padding", "empty-sequence"])
@pytest.mark.parametrize("backend", ["linear_elu", "window"])
def test_native_only_backends_take_their_parts_and_decline_the_rest(name, backend):
    lq, lk, am, hand = build(name)
    q, k, v = qkv(lq=lq, lk=lk)
    why = dict(mh.explain(q, k, mask=am, exact=False))[backend]
    if backend == "window" and am.pattern is None:
        assert "runs only SparsePattern masks" in why
        return
    if backend == "linear_elu" and am.pattern is not None:
        assert why == "takes only causal (Lq == Lk) and key-padding masks, not window patterns"
        return
    assert why is None
    out, _ = mh.attention(q, k, v, mask=am, backend=backend)
    if backend == "window":
        assert (out - formula(q, k, v, hand)).abs().max().item() < 1e-10
    empty = ~hand.any(-1).expand(2, 4, lq)
    assert torch.all(out[empty] == 0) and torch.isfinite(out).all()


def test_each_backend_gets_its_native_parts_and_one_densified_tensor():
    keep = torch.arange(9)[None, :] < torch.tensor([9, 4])[:, None]
    am = AttnMask(key_padding=keep, causal=True)
    sdpa = am.for_backend(("tensor", "causal_alone"), 9, 9)
    assert sdpa.key_padding is None and not sdpa.causal and sdpa.tensor.shape == (2, 1, 9, 9)
    mem = am.for_backend(("tensor", "causal"), 9, 9)  # causal stays native (tiles above the diagonal skipped)
    assert mem.causal and mem.key_padding is None and mem.tensor.shape == (2, 1, 1, 9)  # not L x L
    flex = am.for_backend(("tensor", "key_padding", "causal"), 9, 9)
    assert flex is am  # nothing to densify
    alone = AttnMask(causal=True).for_backend(("tensor", "causal_alone"), 9, 9)
    assert alone.causal and alone.tensor is None  # SDPA's own flag
    offset = AttnMask(causal=True).for_backend(("tensor", "causal_alone"), 3, 9)
    assert not offset.causal and torch.equal(offset.tensor, masks.causal_mask(3, 9))  # KV cache: densified
    assert split_parts(("key_padding", "causal_square"), {"causal", "key_padding"}, True) == (
        {"causal", "key_padding"},
        frozenset(),
    )
    assert split_parts(("key_padding", "causal_square"), {"causal"}, False) == (frozenset(), {"causal"})


def test_key_padding_reaches_the_kernel_as_passed(monkeypatch):
    """From the batch to the kernel the key padding is never re-derived from a tensor's shape: the model's own
    (B, L) tensor object arrives at the window kernel and at the linear kernel."""
    from multihead.attention.backends import linear, sparse

    seen = []
    real_window = sparse.window_attention

    def spy_window(q, k, v, pattern, scale=None, *, key_padding=None):
        seen.append(key_padding)
        return real_window(q, k, v, pattern, scale, key_padding=key_padding)

    monkeypatch.setattr(sparse, "window_attention", spy_window)
    model = mh.TransformerClassifier(50, 32, 4, 2, 2, dropout=0.0, pattern={"window": 3}).eval()
    ids = torch.randint(4, 50, (3, 20))
    keep = torch.arange(20)[None, :] < torch.tensor([20, 11, 5])[:, None]
    with torch.no_grad():
        model(ids, keep)
    assert len(seen) == 2 and all(kp is keep for kp in seen)

    real_elu = linear.elu_attention
    monkeypatch.setattr(
        linear,
        "elu_attention",
        lambda q, k, v, *, key_padding=None, is_causal=False: (
            seen.append(key_padding),
            real_elu(q, k, v, key_padding=key_padding, is_causal=is_causal),
        )[1],
    )
    mha = mh.MultiHeadAttention(32, 4, backend="linear_elu", need_weights=False)
    mha(torch.randn(3, 20, 32), key_padding_mask=keep)
    assert seen[-1] is keep


def test_the_mask_is_checked_once_per_model_call(monkeypatch):
    """check_mask runs once per attention call, and once per model call when the model builds the mask once."""
    calls = []
    real = masks.check_mask
    monkeypatch.setattr(masks, "check_mask", lambda *a, **kw: (calls.append(a[1]), real(*a, **kw))[1])
    mha = mh.MultiHeadAttention(32, 4, need_weights=False)
    x = torch.randn(2, 7, 32)
    keep = torch.ones(2, 7, dtype=torch.bool)
    mha(x, mask=torch.ones(7, 7, dtype=torch.bool), key_padding_mask=keep, is_causal=True)
    assert calls == [(2, 4, 7, 7)]
    calls.clear()
    enc = mh.TransformerEncoder(d_model=32, num_heads=4, d_ff=64, num_layers=3, dropout=0.0)
    enc(x, torch.ones(2, 7, 7, dtype=torch.bool), key_padding_mask=keep)
    assert calls == [(2, 4, 7, 7)]  # three layers, one validation


def test_static_kv_cache_is_an_offset():
    """A buffer of Lk slots with the first ``pos`` filled: causal_offset=pos masks the empty slots (they lie in the
    future of every query), equal to attending the filled prefix with the usual bottom-right alignment."""
    q, k, v = qkv(lq=2, lk=16)
    pos = 6  # queries at positions 6, 7; slots 8.. are empty
    for backend in EXACT:
        out, _ = mh.attention(q, k, v, mask=AttnMask(causal=True, causal_offset=pos), backend=backend)
        ref, _ = mh.attention(q, k[:, :, : pos + 2], v[:, :, : pos + 2], is_causal=True, backend="reference")
        assert (out - ref).abs().max().item() < 1e-10, backend


def test_errors_name_the_fix():
    q, k, v = qkv(lq=5, lk=7)
    with pytest.raises(ValueError, match="self-attention"):
        mh.attention(q, k, v, mask=AttnMask(pattern=SparsePattern(window=1)))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(B, Lk\)=\(2, 7\)"):
        mh.attention(q, k, v, mask=AttnMask(key_padding=torch.ones(2, 5, dtype=torch.bool)))
    with pytest.raises(TypeError, match=r"attention_mask\.bool\(\)"):
        AttnMask(key_padding=torch.ones(2, 7))
    with pytest.raises(TypeError, match="causal_offset must be an int"):
        AttnMask(causal=True, causal_offset=2.5)
    with pytest.raises(ValueError, match="two key-padding masks"):
        AttnMask.of(AttnMask(key_padding=torch.ones(2, 7, dtype=torch.bool)), key_padding=torch.ones(2, 7).bool())
    with pytest.raises(TypeError, match="a tensor, a SparsePattern or an AttnMask"):
        mh.attention(q, k, v, mask=[[True]])
    assert AttnMask.of(None) is None and AttnMask.of(SparsePattern(window=2, causal=True)).causal


def test_pattern_rule_is_written_once():
    """The dense mask, flex's mask_mod and the window kernel's band all evaluate SparsePattern.rule /
    window_band: the mask_mod over an index grid equals dense()."""
    for p in (
        SparsePattern(window=2, dilation=2, global_tokens=(0, 5)),
        SparsePattern(block=3, random_blocks=1),
        SparsePattern(window=1, causal=True),
    ):
        am = AttnMask(pattern=p, key_padding=torch.arange(11)[None, :] < torch.tensor([11, 6])[:, None])
        mod = am.mask_mod(11, 11)
        bi, hi, i, j = torch.meshgrid(
            torch.arange(2), torch.arange(1), torch.arange(11), torch.arange(11), indexing="ij"
        )
        assert torch.equal(mod(bi, hi, i, j), am.dense(11, 11).expand(2, 1, 11, 11))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 10), st.integers(1, 10), st.data())
def test_random_structured_masks_equal_the_formula(b, lq, lk, data):
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 10_000)))
    keep = (torch.rand(b, lk, generator=gen) > 0.4) if data.draw(st.booleans()) else None
    causal = data.draw(st.booleans())
    offset = data.draw(st.one_of(st.none(), st.integers(-lq, lk))) if causal else None
    tensor = (torch.rand(b, 1, lq, lk, generator=gen) > 0.3) if data.draw(st.booleans()) else None
    window = data.draw(st.one_of(st.none(), st.integers(0, 3))) if lq == lk and offset in (None, 0) else None
    am = AttnMask(
        key_padding=keep,
        causal=causal,
        causal_offset=offset,
        tensor=tensor,
        pattern=None if window is None else SparsePattern(window=window),
    )
    backend = data.draw(st.sampled_from(EXACT))
    q, k, v = qkv(b=b, h=2, g=1, lq=lq, lk=lk, seed=int(torch.randint(0, 999, (1,), generator=gen)))
    out, _ = mh.attention(q, k, v, mask=am, backend=backend)
    hand = allowed_by_hand(b, lq, lk, keep, causal, offset, tensor, window)
    assert (out - formula(q, k, v, hand)).abs().max().item() < 1e-10
    w = mh.attention_weights(q, k, mask=am)
    assert torch.all(w.sum(-1)[~hand.any(-1).expand(b, 2, lq)] == 0)


def test_mask_mod_reads_right_padding_as_one_length_per_row_and_any_other_padding_per_key():
    """FlexAttention's mask_mod for key padding: right padding (the usual batch) as ``j < length[b]``, other shapes
    (left padding, holes) by lookup; both equal the padding itself on every (b, j)."""
    i = torch.arange(12)
    right = i[None, :] < torch.tensor([12, 5, 0])[:, None]
    holes = right.clone()
    holes[0, 3] = False
    for keep in (right, holes, right.flip(1)):
        mod = AttnMask(key_padding=keep).mask_mod(4, 12)
        got = torch.stack([mod(torch.tensor(b), torch.tensor(0), torch.tensor(0), i) for b in range(3)])
        assert torch.equal(got, keep)
