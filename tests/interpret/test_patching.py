"""Interventions on heads against their definitions, written here: a head patched with its own activation changes
nothing; every head of a layer patched = the layer's attention output patched; zero ablation = head_mask; batched
patching = one head at a time; attribution patching = exact patching where the metric is linear in z; the logit
lens's last layer = the logits; bad input named."""

import pytest
import torch
from torch import nn

from multihead.interpret.causal import patching as P
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules import MultiHeadAttention
from multihead.modules.decoder import DecoderConfig
from multihead.modules.variants import AttentionConfig


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = CausalLMConfig(
        vocab_size=40,
        max_len=32,
        positional="rope",
        decoder=DecoderConfig(
            d_model=32,
            num_heads=4,
            num_layers=2,
            cross_attention=False,
            norm_first=True,
            dropout=0.0,
            norm="rms",
            activation="swiglu",
            attention=AttentionConfig(num_kv_heads=2),
        ),
    )
    return CausalLM(config).eval()


def _pair():
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 40, (1, 12), generator=g)
    corrupt = clean.clone()
    corrupt[0, 3] = (clean[0, 3] + 7) % 40  # one token changed
    return clean, corrupt


def test_patching_a_head_with_its_own_activation_changes_nothing(lm):
    clean, _ = _pair()
    r = P.activation_patching(lm, clean, clean, P.logit_diff(5, 6), batch_size=5)
    assert torch.equal(r["effect"], torch.zeros(2, 4))  # exactly: each effect is two rows of one pass
    r = P.activation_patching(lm, clean, clean, P.logit_diff(5, 6), per_position=True)
    assert r["effect"].shape == (2, 4, 12) and torch.equal(r["effect"], torch.zeros(2, 4, 12))


def test_batched_patching_equals_one_head_at_a_time(lm):
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6)
    r = P.activation_patching(lm, clean, corrupt, metric, batch_size=3)  # several passes of 2 heads + baseline
    with torch.no_grad():
        base = float(metric(lm(corrupt))[0])
        assert abs(r["corrupt"] - base) < 1e-5 and abs(r["clean"] - float(metric(lm(clean))[0])) < 1e-5
        for layer, head in ((0, 1), (1, 3)):
            with P.ablated(lm, {layer: [head]}, "resample", reference=clean):  # its z from the clean run
                one = float(metric(lm(corrupt))[0])
            assert abs((one - base) - float(r["effect"][layer, head])) < 1e-5
    assert r["effect"].abs().max() > 0


def test_rerunning_from_the_patched_layer_equals_running_the_whole_model(lm):
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6, position=-2)
    whole = lambda model, ids: model(ids)  # another run function: every pass runs every layer
    for per_position in (False, True):
        fast = P.activation_patching(lm, clean, corrupt, metric, batch_size=4, per_position=per_position)
        slow = P.activation_patching(lm, clean, corrupt, metric, batch_size=4, per_position=per_position, run=whole)
        torch.testing.assert_close(fast["effect"], slow["effect"], atol=1e-5, rtol=0)
        assert fast["corrupt"] == pytest.approx(slow["corrupt"], abs=1e-5)


def test_a_causal_lm_resumes_from_any_layer(lm):
    _, ids = _pair()
    seen = []
    handles = [b.register_forward_pre_hook(lambda mod, args: seen.append(args[0])) for b in lm.decoder.layers]
    with torch.no_grad():
        full = lm(ids)
        for h in handles:
            h.remove()
        for layer, resid in enumerate(seen):
            torch.testing.assert_close(lm(ids, resid=resid, start_at_layer=layer), full, atol=1e-6, rtol=0)
        torch.testing.assert_close(lm(ids, logits_at=3), full[:, 3:4], atol=1e-6, rtol=0)
        torch.testing.assert_close(lm(ids, logits_at=-1), full[:, -1:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="needs resid"):
        lm(ids, start_at_layer=1)
    with pytest.raises(ValueError, match="outside the 12 positions"):
        lm(ids, logits_at=12)
    with pytest.raises(ValueError, match="start_at_layer=5"):
        lm(ids, resid=seen[0], start_at_layer=5)


def test_every_head_of_a_layer_equals_the_layers_attention_output(lm):
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6)
    block = lm.decoder.layers[1]
    with torch.no_grad():
        kept = {}
        h = block.hook_attn_out.add_hook(lambda t, hook: kept.setdefault("out", t.clone()))
        lm(clean)
        h.remove()
        h = block.hook_attn_out.add_hook(lambda t, hook: kept["out"])
        via_output = float(metric(lm(corrupt))[0])
        h.remove()
        with P.ablated(lm, {1: [0, 1, 2, 3]}, "resample", reference=clean):
            via_heads = float(metric(lm(corrupt))[0])
    assert abs(via_output - via_heads) < 1e-5


def test_zero_ablation_is_head_mask(lm):
    ids, _ = _pair()
    mask = torch.ones(2, 4)
    mask[0, 2] = mask[1, 0] = 0
    with torch.no_grad():
        with P.ablated(lm, {0: [2], 1: [0]}, "zero"):
            ablated = lm(ids)
        assert torch.equal(ablated, lm(ids, head_mask=mask))


def test_mean_ablation_uses_the_reference_mean(lm):
    ids, other = _pair()
    ref = torch.cat([ids, other])
    z = P.head_outputs(lm, ref)[0][:, 1].mean(dim=(0, 1))  # layer 0, head 1: mean over batch and positions
    seen = {}
    with torch.no_grad(), P.ablated(lm, {0: [1]}, "mean", reference=ref):
        h = lm.decoder.layers[0].self_attn.w_o.register_forward_pre_hook(lambda m, a: seen.setdefault("z", a[0]))
        lm(ids)
        h.remove()
    z_in = seen["z"].view(1, 12, 4, 8)[0, :, 1]  # (L, D) of head 1 as the output projection reads it
    assert torch.allclose(z_in, z.expand(12, 8), atol=1e-6)


class _LinearReadout(nn.Module):
    """One attention layer read out linearly: the metric is linear in every head's z."""

    def __init__(self):
        super().__init__()
        self.attn = MultiHeadAttention(16, 4)
        self.readout = nn.Linear(16, 1)

    def forward(self, x):
        return self.readout(self.attn(x, need_weights=False)[0])[..., 0]  # (B, L)


def test_attribution_patching_is_exact_where_the_metric_is_linear_in_z():
    torch.manual_seed(0)
    model = _LinearReadout().eval()
    clean, corrupt = torch.randn(1, 6, 16), torch.randn(1, 6, 16)
    # patching z changes only the output projection's input (q, k, v come from the input): linear in z
    metric = lambda out: out[:, -1] + out[:, 2]  # noqa: E731
    exact = P.activation_patching(model, clean, corrupt, metric)["effect"]
    approx = P.attribution_patching(model, clean, corrupt, metric)["effect"]
    assert torch.allclose(exact, approx, atol=1e-5) and exact.abs().max() > 1e-3
    assert all(p.requires_grad and p.grad is None for p in model.parameters())  # no parameter gradient kept


def test_attribution_patching_on_a_language_model_tracks_exact_patching(lm):
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6)
    exact = P.activation_patching(lm, clean, corrupt, metric)["effect"].flatten()
    approx = P.attribution_patching(lm, clean, corrupt, metric)["effect"].flatten()
    assert torch.corrcoef(torch.stack([exact, approx]))[0, 1] > 0.5  # an estimate: same direction, not equal


def test_logit_lens_last_layer_is_the_logits(lm):
    ids, _ = _pair()
    lens = P.logit_lens(lm, ids)
    with torch.no_grad():
        assert len(lens) == 2 and torch.allclose(lens[-1], lm(ids), atol=1e-5)


def test_bad_input_is_named(lm):
    clean, corrupt = _pair()
    with pytest.raises(ValueError, match=r"clean \(1, 12\) \(12 tokens\), corrupted \(1, 9\) \(9 tokens\)"):
        P.activation_patching(lm, clean, corrupt[:, :9], P.logit_diff(5, 6))
    with pytest.raises(ValueError, match="heads \\[7\\] of layer 1 do not exist: it has 4 heads"):
        with P.ablated(lm, {1: [7]}):
            pass
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        with P.ablated(lm, {5: [0]}):
            pass
    with pytest.raises(ValueError, match="not finite"):
        P.activation_patching(lm, clean, corrupt, lambda out: out[:, -1, 0] * float("nan"))
    with pytest.raises(ValueError, match="one number per batch row"):
        P.attribution_patching(lm, clean, corrupt, lambda out: out[:, -1, :2])  # two numbers per row
    with pytest.raises(ValueError, match="reference="):
        with P.ablated(lm, {0: [0]}, "mean"):
            pass


def test_path_patching_without_senders_changes_nothing(lm):
    clean, corrupt = _pair()
    r = P.path_patching(
        lm, clean, corrupt, P.logit_diff(5, 6), senders={}, receivers={1: [0, 1, 2, 3]}, through=("q", "k", "v")
    )
    assert r["effect"] == 0.0


def test_path_patching_from_every_earlier_head_is_patching_the_receivers_inputs():
    torch.manual_seed(0)
    config = CausalLMConfig(
        vocab_size=40,
        max_len=32,
        positional="rope",
        decoder=DecoderConfig(
            d_model=32, num_heads=4, num_layers=2, d_ff=0, cross_attention=False, norm_first=True, dropout=0.0
        ),
    )
    model = CausalLM(config).eval()  # attention only: layer 1's inputs change only through layer 0's heads
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6)
    r = P.path_patching(
        model, clean, corrupt, metric, senders={0: [0, 1, 2, 3]}, receivers={1: [0, 1, 2, 3]}, through=("q", "k", "v")
    )
    attn = model.decoder.layers[1].self_attn
    seen = {}
    with torch.no_grad():
        with P.ablated(model, {0: [0, 1, 2, 3]}, "resample", reference=corrupt):  # layer 0 from the corrupted run
            hs = [getattr(attn, f"hook_{w}").add_hook(lambda t, h, w=w: seen.__setitem__(w, t.clone())) for w in "qkv"]
            model(clean)
            for h in hs:
                h.remove()
        hs = [getattr(attn, f"hook_{w}").add_hook(lambda t, h, w=w: seen[w]) for w in "qkv"]
        direct = float(metric(model(clean))[0])
        for h in hs:
            h.remove()
    assert abs(r["patched"] - direct) < 1e-5 and abs(r["effect"]) > 1e-4


def test_path_patching_each_sender_in_batches_equals_one_call_per_sender(lm):
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6)
    each = P.path_patching_each(lm, clean, corrupt, metric, receivers={1: [0, 2]}, through="q", batch_size=3)
    assert each["effect"].shape == (2, 4) and torch.isnan(each["effect"][1]).all()  # senders: layer 0 only
    for head in range(4):
        one = P.path_patching(lm, clean, corrupt, metric, senders={0: [head]}, receivers={1: [0, 2]}, through="q")
        assert abs(one["effect"] - float(each["effect"][0, head])) < 1e-5
    assert each["effect"][0].abs().max() > 1e-4
    with pytest.raises(ValueError, match="heads \\[7\\] of layer 1 do not exist"):
        P.path_patching_each(lm, clean, corrupt, metric, receivers={1: [7]})


def test_path_patching_through_keys_patches_the_shared_key_value_head(lm):
    clean, corrupt = _pair()
    # receiver head 0 shares its key/value head with head 1 (4 query heads, 2 key/value heads)
    a = P.path_patching(lm, clean, corrupt, P.logit_diff(5, 6), senders={0: [0, 1, 2, 3]}, receivers={1: [0]})
    b = P.path_patching(lm, clean, corrupt, P.logit_diff(5, 6), senders={0: [0, 1, 2, 3]}, receivers={1: [1]})
    assert a["effect"] == b["effect"]
    with pytest.raises(ValueError, match="through must be"):
        P.path_patching(lm, clean, corrupt, P.logit_diff(5, 6), senders={}, receivers={1: [0]}, through="o")


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_direct_logit_attribution_adds_up_to_the_logit_difference(norm):
    torch.manual_seed(0)
    config = CausalLMConfig(
        vocab_size=40,
        max_len=32,
        positional="learned",
        decoder=DecoderConfig(
            d_model=32,
            num_heads=4,
            num_layers=2,
            cross_attention=False,
            norm_first=True,
            dropout=0.0,
            norm=norm,
            bias=norm == "layer",
        ),
    )
    model = CausalLM(config).eval()
    ids, _ = _pair()
    r = P.direct_logit_attribution(model, ids, answer=5, wrong=6)
    assert r["heads"].shape == (2, 4) and r["mlp"].shape == (2,)
    assert abs(r["check"]["sum_of_parts"] - r["check"]["logit_difference"]) < 1e-4


def test_direct_logit_attribution_refuses_what_it_cannot_split():
    torch.manual_seed(0)
    config = CausalLMConfig(
        vocab_size=40,
        max_len=32,
        decoder=DecoderConfig(
            d_model=32, num_heads=4, num_layers=1, cross_attention=False, norm_first=False, dropout=0.0
        ),
    )
    with pytest.raises(ValueError, match="pre-norm"):
        P.direct_logit_attribution(CausalLM(config).eval(), _pair()[0], answer=1)


def _encoder_decoder():
    import multihead as mh

    torch.manual_seed(0)
    cfg = mh.Seq2SeqConfig(
        src_vocab_size=30,
        tgt_vocab_size=40,
        max_len=16,
        encoder=mh.EncoderConfig(d_model=32, num_heads=4, num_layers=2, dropout=0.0),
        decoder=mh.DecoderConfig(d_model=32, num_heads=4, num_layers=2, dropout=0.0),
    )
    model = mh.Seq2Seq(cfg).eval()
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(3, 30, (1, 7), generator=g), torch.randint(3, 40, (1, 5), generator=g)
    other = src.clone()
    other[0, 2] = (src[0, 2] + 5) % 27 + 3
    # every attention module in order: 2 encoder self-attentions, then each decoder layer's self- and cross-attention
    return model, (src, tgt), (other, tgt), lambda m, x: m(*x), lambda out: out[:, -1, 7].float(), 6


def _vision():
    from multihead.models.vision import VisionConfig, VisionTransformer
    from multihead.modules.encoder import EncoderConfig

    torch.manual_seed(0)
    enc = EncoderConfig(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0, norm_first=True)
    model = VisionTransformer(VisionConfig(image_size=8, patch_size=2, encoder=enc)).eval()
    g = torch.Generator().manual_seed(2)
    image = torch.randn(1, 1, 8, 8, generator=g)
    return model, image, image.flip(-1), P._run, lambda out: out[:, 3].float(), 2


def _text_encoder():
    import multihead as mh

    torch.manual_seed(0)
    model = mh.TransformerClassifier(60, 32, 4, 3, 3, dropout=0.0).eval()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 60, (1, 9), generator=g)
    other = ids.clone()
    other[0, 4] = (ids[0, 4] + 11) % 59 + 1
    return model, ids, other, P._run, lambda out: out[:, 1].float() - out[:, 0].float(), 3


@pytest.mark.parametrize("build", [_encoder_decoder, _vision, _text_encoder], ids=["g2p-seq2seq", "vit", "classifier"])
def test_the_same_interventions_run_on_encoders_encoder_decoders_and_vision_models(build):
    model, clean, corrupt, run, metric, modules = build()
    same = P.activation_patching(model, clean, clean, metric, run=run, batch_size=5)
    # zero up to rounding: at some shapes BLAS rounds the rows of one batch differently (measured on the ViT: rows
    # of five identical images differ by 2e-7), so a patched row and the baseline row need not agree to the bit
    assert same["effect"].shape == (modules, 4) and same["effect"].abs().max() <= 1e-6
    r = P.activation_patching(model, clean, corrupt, metric, run=run, batch_size=5)
    assert r["effect"].abs().max() > 0
    with torch.no_grad():
        base = float(metric(run(model, corrupt))[0])
        for layer, head in ((0, 1), (modules - 1, 2)):  # one head patched alone: its z from the clean run
            with P.ablated(model, {layer: [head]}, "resample", reference=clean, run=run):
                one = float(metric(run(model, corrupt))[0])
            assert abs((one - base) - float(r["effect"][layer, head])) < 1e-5
    a = P.attribution_patching(model, clean, corrupt, metric, run=run)
    assert a["effect"].shape == (modules, 4) and torch.isfinite(a["effect"]).all()
    assert float(torch.corrcoef(torch.stack([a["effect"].flatten(), r["effect"].flatten()]))[0, 1]) > 0


def test_patch_pairs_is_the_mean_of_each_pairs_patching(lm):
    torch.manual_seed(3)
    pairs = [(torch.randint(0, 40, (1, 8)), torch.randint(0, 40, (1, 8)), P.logit_diff(3, 7)) for _ in range(3)]
    r = P.patch_pairs(lm, pairs, batch_size=5)
    each = [P.activation_patching(lm, c, x, m)["effect"] for c, x, m in pairs]
    torch.testing.assert_close(r["effect"], torch.stack(each).mean(0), atol=1e-6, rtol=0)
    est = torch.stack([P.attribution_patching(lm, c, x, m)["effect"] for c, x, m in pairs]).mean(0)
    torch.testing.assert_close(r["attribution"], est, atol=1e-6, rtol=0)
    a, b = r["effect"].flatten(), est.flatten()
    pearson = ((a - a.mean()) * (b - b.mean())).sum() / ((a - a.mean()).norm() * (b - b.mean()).norm())
    assert abs(r["correlation"] - float(pearson)) < 1e-5
    per_pos = P.patch_pairs(lm, pairs[:1], per_position=True)
    assert per_pos["effect"].dim() == 3 and "attribution" not in per_pos
    torch.testing.assert_close(P.per_head(per_pos["effect"]), per_pos["effect"].abs().amax(-1))
    with pytest.raises(ValueError, match="at least one"):
        P.patch_pairs(lm, [])


def test_attribution_patching_uses_the_whole_derivative_through_later_layers(lm):
    """Each head's gradient is d metric / d z through every later layer (their attention included), as autograd
    gives it on the plain model: written here with retain_grad on every layer's z."""
    clean, corrupt = _pair()
    metric = P.logit_diff(5, 6)
    approx = P.attribution_patching(lm, clean, corrupt, metric)["effect"]
    zs_clean = P.head_outputs(lm, clean)
    kept = []

    def keep(z, hook):
        z.retain_grad()
        kept.append(z)
        return z

    from multihead.modules.capture import attention_modules

    handles = [m.hook_z.add_hook(keep) for _, m in attention_modules(lm)]
    try:
        with torch.enable_grad():
            metric(lm(corrupt)).sum().backward()
    finally:
        for h in handles:
            h.remove()
        lm.zero_grad(set_to_none=True)
    plain = torch.stack([((c - z.detach()) * z.grad).sum((0, 2, 3)) for c, z in zip(zs_clean, kept)])
    torch.testing.assert_close(approx, plain, atol=1e-5, rtol=1e-4)


def test_a_batch_averaged_metric_as_transformer_lens_writes_it_is_taken_one_row_at_a_time(lm):
    clean, corrupt = _pair()

    def averaged(logits):  # TransformerLens's habit: one number for the whole batch
        return (logits[:, -1, 5] - logits[:, -1, 6]).mean()

    per_row = P.activation_patching(lm, clean, corrupt, P.logit_diff(5, 6), batch_size=4)
    averaged_too = P.activation_patching(lm, clean, corrupt, averaged, batch_size=4)  # asked of each row alone
    assert torch.allclose(per_row["effect"], averaged_too["effect"], atol=1e-5)
