"""capture(): weights equal the reference backend's, outputs unchanged, nothing attached afterwards."""

import pytest
import torch

import multihead as mh
from multihead.attention import registry
from multihead.interpret import capture, run_with_cache

BACKENDS = sorted(
    n
    for n, b in mh.list_backends().items()
    if b.capabilities.exact
    and not b.capabilities.requires_pattern
    and "cpu" in b.capabilities.backward_devices
    and b.available() is None
)


def _model(backend):
    torch.manual_seed(0)
    return mh.TransformerClassifier(50, 32, 4, 3, 2, backend=backend, dropout=0.0).eval()


def _batch():
    ids = torch.randint(4, 50, (3, 11))
    keep = torch.ones(3, 11, dtype=torch.bool)
    keep[1, 7:] = False
    keep[2, 4:] = False
    return ids.masked_fill(~keep, 0), keep


@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_weights_equal_the_reference_backends(backend):
    model = _model(backend)
    ids, keep = _batch()
    with capture(model) as cache, torch.no_grad():
        model(ids, keep)  # the default, unpadded path
    inputs = {}  # each layer's input, from the padded path (hooks on the blocks need it)
    handles = [
        layer.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0].detach()))
        for i, layer in enumerate(model.encoder.layers)
    ]
    model.encoder.config.unpad = False
    with torch.no_grad():
        model(ids, keep)
    for h in handles:
        h.remove()
    rows = keep[:, None, :, None]  # real query rows (padded rows are never used downstream)
    assert len(cache.patterns()) == 3
    for i, layer in enumerate(model.encoder.layers):
        with torch.no_grad():
            _, ref = layer.attn(inputs[i], key_padding_mask=keep, need_weights=True)  # reference backend's weights
        assert ((cache.pattern(i) - ref).abs() * rows).max().item() <= 1e-6, i
        assert cache.pattern(i).shape == (3, 4, 11, 11)
        real_rows = cache.pattern(i).sum(-1)[keep[:, None, :].expand(3, 4, 11)]
        assert torch.allclose(real_rows, torch.ones_like(real_rows), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_capture_leaves_outputs_unchanged(backend):
    model = _model(backend)
    ids, keep = _batch()
    with torch.no_grad():
        plain = model(ids, keep)
    out, cache = run_with_cache(model, ids, keep, what=("pattern", "q", "k", "v", "z"))
    assert torch.allclose(out, plain, atol=1e-5)
    assert cache.get_layer("q", 0).shape == (3, 4, 11, 8) and cache.get_layer("z", 2).shape == (3, 4, 11, 8)


def test_capture_costs_nothing_outside_the_block(monkeypatch):
    model = _model("auto")
    ids, keep = _batch()
    with capture(model, ("pattern", "z")):
        model(ids, keep)
    assert not any(hp.active for hp in mh.hook_points(model).values())

    def explicit(*a, **k):
        raise AssertionError("weights were computed although nobody asked")

    from multihead.attention import ops

    monkeypatch.setattr(ops, "probabilities", explicit)  # the explicit-weights formula
    monkeypatch.setattr(registry, "attention_weights", explicit)
    with torch.no_grad():
        model(ids, keep)


def test_capture_on_imported_minilm_and_bad_requests():
    from multihead import pretrained

    p = pretrained.load("minilm")
    ids, mask = p.encode(["The cat sat on the mat."])
    _, cache = run_with_cache(p.model, ids, mask)
    assert [w.shape for w in cache.patterns()] == [(1, 12, 9, 9)] * 6
    with pytest.raises(ValueError, match="cannot capture"):
        with capture(p.model, ("attention",)):
            pass
    with pytest.raises(ValueError, match="no multihead MultiHeadAttention"):
        with capture(torch.nn.Linear(2, 2)):
            pass
    with capture(p.model, layers=[0]) as cache:
        p.model(ids, mask)
    with pytest.raises(KeyError, match="was not captured"):
        cache.pattern(3)


def test_result_and_resid_are_what_each_head_writes_and_the_stream_after_each_block():
    from multihead.modules.capture import capture
    from multihead.models.seq2seq import CausalLM, CausalLMConfig
    from multihead.modules.decoder import DecoderConfig

    torch.manual_seed(0)
    lm = CausalLM(
        CausalLMConfig(
            vocab_size=30,
            max_len=16,
            positional="rope",
            decoder=DecoderConfig(
                d_model=32, num_heads=4, num_layers=2, cross_attention=False, norm_first=True, dropout=0.0
            ),
        )
    ).eval()
    ids = torch.randint(0, 30, (2, 7))
    outs, posts = {}, {}
    hs = []
    for i, b in enumerate(lm.decoder.layers):
        hs.append(b.hook_attn_out.add_hook(lambda t, h, i=i: outs.__setitem__(i, t.clone())))
        hs.append(b.hook_resid_post.add_hook(lambda t, h, i=i: posts.__setitem__(i, t.clone())))
    with capture(lm, ("result", "resid")) as cache, torch.no_grad():
        lm(ids)
    for h in hs:
        h.remove()
    for i, b in enumerate(lm.decoder.layers):
        result = cache.get_layer("result", i)
        assert result.shape == (2, 4, 7, 32)  # (B, H, L, E): one vector per head and position
        # the heads' writes plus the output bias are the attention output, as the block adds it to the stream
        torch.testing.assert_close(result.sum(1) + b.self_attn.w_o.bias, outs[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.get_layer("resid", i), posts[i], atol=0, rtol=0)
    with pytest.raises(KeyError, match="was not captured"):
        cache.get_layer("z", 0)
