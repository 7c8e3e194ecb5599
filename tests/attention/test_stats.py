"""attention_stats: every statistic equals the value computed from the full fp64 weights (the reference formula,
written here), under padding, causal, a window pattern, a float bias and GQA, with tiles smaller than the input."""

import math

import pytest
import torch

from multihead.attention import AttnMask, attention_weights
from multihead.attention.patterns import SparsePattern
from multihead.attention.stats import attention_stats

CASES = {
    "plain": dict(),
    "padding": dict(key_padding=True),
    "causal": dict(is_causal=True),
    "causal-padding-gqa": dict(is_causal=True, key_padding=True, kv_heads=2),
    "window": dict(pattern=SparsePattern(window=3)),
    "window-global-causal": dict(pattern=SparsePattern(window=2, global_tokens=(0,), causal=True)),
    "bias": dict(bias=True),
    "cross-longer-keys": dict(lk=29),
    "cross-causal-offset": dict(lk=29, is_causal=True),
}


def _inputs(case, b=2, h=4, lq=23, d=8, seed=0):
    torch.manual_seed(seed)
    kv = case.get("kv_heads", h)
    lk = case.get("lk", lq)
    q = torch.randn(b, h, lq, d, dtype=torch.float64) * 1.5
    k = torch.randn(b, kv, lk, d, dtype=torch.float64) * 1.5
    kp = None
    if case.get("key_padding"):
        kp = torch.ones(b, lk, dtype=torch.bool)
        kp[1, lk - 6 :] = False
    mask = case.get("pattern")
    if case.get("bias"):
        mask = torch.randn(1, h, lq, lk, dtype=torch.float64)
    return q, k, mask, kp


def _full(q, k, case, mask, kp):
    am = AttnMask.of(mask, is_causal=case.get("is_causal", False), key_padding=kp)
    return attention_weights(q, k, mask=am)  # (b, h, i, j) fp64, empty rows zero


@pytest.mark.parametrize("name", list(CASES))
def test_each_statistic_equals_the_full_map(name):
    case = CASES[name]
    q, k, mask, kp = _inputs(case)
    sets = {"evens": torch.arange(0, k.shape[2], 2), "last3": torch.arange(k.shape[2] - 3, k.shape[2])}
    st = attention_stats(
        q,
        k,
        mask=mask,
        is_causal=case.get("is_causal", False),
        key_padding_mask=kp,
        topk=5,
        sets=sets,
        offsets=(-1, 0, 2),
        heads=[1, 3],
        rows=[0, 7, 22],
        thumbnail=6,
        block_q=4,
        block_k=5,
    )
    p = _full(q, k, case, mask, kp)
    lq, lk = p.shape[-2:]
    tol = dict(atol=1e-6, rtol=0)
    # entropy -sum p log p (0 log 0 = 0)
    ent = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    torch.testing.assert_close(st.entropy, ent, **tol)
    torch.testing.assert_close(st.received, p.sum(-2), **tol)
    pos = torch.arange(lq, dtype=torch.float64) + (lk - lq)
    dist = (pos[:, None] - torch.arange(lk, dtype=torch.float64)[None, :]).abs()
    torch.testing.assert_close(st.distance, (p * dist).sum(-1), **tol)
    torch.testing.assert_close(st.mass["first"], p[..., 0], **tol)
    torch.testing.assert_close(st.mass["evens"], p[..., ::2].sum(-1), **tol)
    torch.testing.assert_close(st.mass["last3"], p[..., -3:].sum(-1), **tol)
    torch.testing.assert_close(st.weights, p[:, [1, 3]][:, :, [0, 7, 22]], **tol)
    bq_, bk_ = torch.arange(lq) * 6 // lq, torch.arange(lk) * 6 // lk  # each position's thumbnail bin
    want = torch.stack(
        [torch.stack([p[..., bq_ == a, :][..., bk_ == c].mean((-1, -2)) for c in range(6)], -1) for a in range(6)], -2
    )
    torch.testing.assert_close(st.thumbnail, want, **tol)
    for o in (-1, 0, 2):  # the weight at key pos(i) + o (0 where that key does not exist)
        want = torch.zeros_like(st.entropy)
        for i in range(lq):
            j = i + (lk - lq) + o
            if 0 <= j < lk:
                want[..., i] = p[..., i, j]
        torch.testing.assert_close(st.mass[f"offset{o:+d}"], want, **tol)
    # top-k: the same weights as torch.topk of the full map; the same keys wherever weights are not tied
    w, ix = p.topk(5, dim=-1)
    torch.testing.assert_close(st.topk_weight, w, **tol)
    untied = (w[..., :-1] - w[..., 1:]).abs() > 1e-9
    untied = (
        torch.cat([untied, torch.ones_like(untied[..., :1])], -1)
        & torch.cat([torch.ones_like(untied[..., :1]), untied], -1)
        & (w > 0)
    )
    assert torch.equal(st.topk_index[untied], ix[untied])
    # lse: log-sum-exp of the masked scores (the dense mask built here, for the test only)
    scores = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    dense = AttnMask.of(mask, is_causal=case.get("is_causal", False), key_padding=kp)
    dense = None if dense is None else dense.dense(lq, lk)
    if dense is not None:
        scores = scores.masked_fill(~dense, -math.inf) if dense.dtype == torch.bool else scores + dense
    torch.testing.assert_close(st.lse, torch.logsumexp(scores, -1), **tol)


def test_rows_with_no_key_are_zero_not_nan():
    q, k = torch.randn(1, 2, 4, 8, dtype=torch.float64), torch.randn(1, 2, 4, 8, dtype=torch.float64)
    allow = torch.ones(4, 4, dtype=torch.bool)
    allow[2] = False  # query 2 may attend nothing
    st = attention_stats(q, k, mask=allow, block_q=2, block_k=3)
    assert torch.isinf(st.lse[0, :, 2]).all() and not st.allowed_rows[0, :, 2].any()
    for t in (st.entropy, st.distance, st.mass["first"], st.topk_weight):
        assert torch.isfinite(t).all() and (t[0, :, 2] == 0).all()


def test_entropy_of_known_maps_and_the_result_is_linear_in_length():
    """Equal scores over n keys -> entropy log n exactly; at L = 8,192 what is returned is O(L) (peak memory while
    computing is measured by ``multihead bench stats``)."""
    q = torch.zeros(1, 1, 6, 4)
    st = attention_stats(q, torch.randn(1, 1, 6, 4), is_causal=True, block_q=2, block_k=2)
    torch.testing.assert_close(st.entropy[0, 0], torch.log(torch.arange(1, 7, dtype=torch.float32)), atol=1e-6, rtol=0)
    torch.testing.assert_close(st.distance[0, 0], torch.arange(6, dtype=torch.float32) / 2, atol=1e-5, rtol=0)
    L = 8192
    q, k = torch.randn(1, 2, L, 16), torch.randn(1, 2, L, 16)
    st = attention_stats(q, k, is_causal=True, topk=4, block_q=256, block_k=1024)
    assert st.nbytes() < 40 * L * 2 * 4  # O(L): a handful of (b, h, L) tensors, not 2 x 8192^2 x 4 = 512 MiB


def test_bad_arguments_name_the_fix():
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"heads must be indices in \[0, 2\)"):
        attention_stats(q, k, heads=[2], rows=[0])
    with pytest.raises(ValueError, match="key set 'x'"):
        attention_stats(q, k, sets={"x": [9]})
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        attention_stats(torch.randn(1, 3, 4, 8), k)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        attention_stats(q, k, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))


def test_topk_by_chunks_equals_torch_topk_on_long_rows():
    """Tiles of 64+ keys take the chunked top-k path: the same weights and keys as torch.topk of the full map."""
    torch.manual_seed(3)
    q, k = torch.randn(1, 2, 70, 8, dtype=torch.float64) * 2, torch.randn(1, 2, 300, 8, dtype=torch.float64) * 2
    st = attention_stats(q, k, topk=6, block_q=32, block_k=128)
    w, ix = attention_weights(q, k).topk(6, dim=-1)
    torch.testing.assert_close(st.topk_weight, w, atol=1e-12, rtol=0)
    assert torch.equal(st.topk_index, ix)  # random fp64 weights: no ties


def test_capture_stats_from_a_model_equals_the_captured_maps():
    """capture(model, ("stats",)) on a padded batch through the fused path: the same statistics as the full maps
    captured from the same call, and the model's output unchanged."""
    from multihead.modules.capture import capture
    from multihead.modules.encoder import EncoderConfig, TransformerEncoder
    from multihead.modules.variants import AttentionConfig

    torch.manual_seed(0)
    enc = TransformerEncoder(
        EncoderConfig(d_model=32, num_heads=4, attention=AttentionConfig(num_kv_heads=2), num_layers=2, dropout=0.0)
    ).eval()
    x = torch.randn(2, 40, 32)
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[1, 25:] = False
    with torch.no_grad():
        plain = enc(x, key_padding_mask=keep)
        with capture(enc, ("pattern",)) as maps:
            enc(x, key_padding_mask=keep)
        with capture(enc, ("stats",), stats={"topk": 3, "offsets": (-1,)}) as cache:
            out = enc(x, key_padding_mask=keep)
    torch.testing.assert_close(out, plain)
    for layer in range(2):
        st, p = cache.stats(layer), maps.pattern(layer)
        torch.testing.assert_close(st.received.float(), p.sum(-2), atol=1e-4, rtol=0)
        torch.testing.assert_close(st.topk_weight.float(), p.topk(3, -1).values, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            st.mass["offset-1"][..., 1:].float(), torch.diagonal(p, offset=-1, dim1=-2, dim2=-1), atol=1e-5, rtol=0
        )
    assert all(m.stats_options == {} for m in enc.modules() if hasattr(m, "stats_options"))  # restored
