"""Sparse backends equal the reference backend under the pattern's dense mask (outputs and gradients)."""

import pytest
import torch

import multihead as mh
from multihead.attention import AttnMask
from multihead.attention.patterns import SparsePattern

PATTERNS = {
    "window": SparsePattern(window=5),
    "window-causal": SparsePattern(window=7, causal=True),
    "window-w0": SparsePattern(window=0),
    "window-global": SparsePattern(window=3, global_tokens=(0, 17)),
    "window-global-causal": SparsePattern(window=4, global_tokens=(0, 9), causal=True),
    "window-dilated": SparsePattern(window=3, dilation=3),
    "window-dilated-causal": SparsePattern(window=2, dilation=2, causal=True),
    "window-wide": SparsePattern(window=200),
    "block": SparsePattern(block=8, random_blocks=1, seed=3),
    "block-causal": SparsePattern(block=8, random_blocks=2, causal=True),
    "block-2global": SparsePattern(block=5, global_blocks=2, window_blocks=0, random_blocks=1),
}


def explicit(q, k, v, allowed):
    """The reference formula in fp64 (the reference backend's softmax runs in fp32); empty rows -> 0."""
    h = q.shape[1]
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sparse_backend_equals_reference_under_dense_mask(name, padded, gqa):
    pattern = PATTERNS[name]
    gen = torch.Generator().manual_seed(len(name) + 7 * padded + 3 * gqa)
    b, h, length, d = 2, 4, 61, 16
    g = 2 if gqa else h
    q = torch.randn(b, h, length, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, g, length, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, g, length, d, generator=gen, dtype=torch.float64)
    keep = torch.arange(length)[None, :] < torch.tensor([length, 40])[:, None] if padded else None
    backend = "window" if pattern.kind == "window" else "block_sparse"
    assert pattern.dense(length).float().mean() < 1 or name == "window-wide"  # a real pattern (wide: w > L)
    mask = AttnMask(pattern=pattern, key_padding=keep)
    dense = mask.dense(length, length)

    def run(fn):
        ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*ts)
        out.backward(torch.ones_like(out) * torch.linspace(-1, 1, d, dtype=out.dtype))
        return out.detach(), [t.grad for t in ts]

    out, grads = run(lambda a, bb, c: mh.attention(a, bb, c, mask=mask, backend=backend)[0])
    ref, ref_grads = run(lambda a, bb, c: explicit(a, bb, c, dense))
    assert (out - ref).abs().max().item() < 1e-10
    for x, y in zip(grads, ref_grads):
        assert (x - y).abs().max().item() < 1e-10


def test_auto_runs_patterns_natively_and_dense_backends_get_the_dense_mask():
    q = torch.randn(1, 2, 40, 8)
    pattern = SparsePattern(window=4)
    names = dict(mh.explain(q, q, mask=pattern))
    assert names["window"] is None and "does not run window" in names["block_sparse"]
    out_auto, _ = mh.attention(q, q, q, mask=pattern)
    out_sdpa, _ = mh.attention(q, q, q, mask=pattern, backend="sdpa")  # dense fallback
    assert torch.allclose(out_auto, out_sdpa, atol=1e-5)
    with pytest.raises(ValueError, match="runs only SparsePattern masks"):
        mh.attention(q, q, q, backend="window")
    with pytest.raises(ValueError, match="self-attention"):
        mh.attention(q, q[:, :, :30], q[:, :, :30], mask=pattern)
    with pytest.raises(ValueError, match="either a sliding window"):
        SparsePattern(window=2, block=4)


def test_window_work_is_linear_in_length(monkeypatch):
    """The window kernel's score tiles total (L/c) x c x (c + 2w) per head, not L x L."""
    import torch.nn.functional as F

    from multihead.attention.backends import sparse

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append(q.shape[:-1].numel() * k.shape[-2])  # entries of the score tensor this call implies
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 1, 4096, 8)
    sparse.window_attention(q, q, q, SparsePattern(window=16))
    assert seen and max(seen) <= 4096 * (32 + 2 * 16)  # vs 4096 * 4096 dense


def test_a_model_with_a_window_pattern_equals_its_dense_mask():
    torch.manual_seed(0)
    model = mh.TransformerClassifier(50, 32, 4, 2, 2, dropout=0.0, pattern={"window": 3}).eval()
    ids = torch.randint(4, 50, (3, 40))
    keep = torch.arange(40)[None, :] < torch.tensor([40, 25, 7])[:, None]
    ids = ids.masked_fill(~keep, 0)
    with torch.no_grad():
        sparse_out = model(ids, keep)  # window backend (auto), key padding bound to the pattern
        for layer in model.encoder.layers:  # the same weights with the dense equivalent mask
            layer.attn.pattern = None
        dense = SparsePattern(window=3).dense(40)
        full = model.embeddings(ids)
        for layer in model.encoder.layers:
            full = layer(full, mask=dense[None] & keep[:, None, :])
        ref = model.fc(model.pool(full, keep))
    assert (sparse_out - ref).abs().max().item() < 1e-5
    assert "pattern=window" in repr(mh.TransformerClassifier(50, 32, 4, 1, 2, pattern={"window": 2}))
