"""One model two ways: an HF Llama (GQA) read natively into multihead's CausalLM, and the same HF model attached.
Every intervention of multihead.interpret.causal.patching gives the same numbers on both (the native one resumes from the
patched layer and projects one position; the attached one reruns HF's model)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf, lm  # noqa: E402
from multihead.interpret.causal import patching as P  # noqa: E402

from .archs import ARCHS  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    model = ARCHS["llama"].build()
    with torch.no_grad():  # weights larger than HF's 0.02 init, so that heads differ measurably
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.08)
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder, safe_serialization=True)
    native = lm.load(folder).model
    hf.attach(model)
    yield native, model
    hf.detach(model)


def _inputs():
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(3, 128, (1, 10), generator=g)
    corrupt = clean.clone()
    corrupt[0, 4] = (corrupt[0, 4] + 17) % 128
    return clean, corrupt, P.logit_diff(5, 6)


def test_logits_are_the_same(pair):
    native, attached = pair
    clean, _, _ = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(native(clean), attached(clean).logits, atol=1e-5, rtol=1e-5)


def test_activation_and_attribution_patching_agree(pair):
    native, attached = pair
    clean, corrupt, metric = _inputs()
    a = P.activation_patching(native, clean, corrupt, metric)
    b = P.activation_patching(attached, clean, corrupt, metric)
    assert a["effect"].abs().max() > 1e-3
    torch.testing.assert_close(a["effect"], b["effect"], atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(
        P.attribution_patching(native, clean, corrupt, metric)["effect"],
        P.attribution_patching(attached, clean, corrupt, metric)["effect"],
        atol=1e-4,
        rtol=1e-3,
    )


@pytest.mark.parametrize("through", ["q", "k", "v"])
def test_path_patching_agrees(pair, through):
    native, attached = pair
    clean, corrupt, metric = _inputs()
    kw = dict(senders={0: [0, 3]}, receivers={1: [1, 2]}, through=through)
    a = P.path_patching(native, clean, corrupt, metric, **kw)
    b = P.path_patching(attached, clean, corrupt, metric, **kw)
    assert abs(a["effect"]) > 1e-5
    assert abs(a["effect"] - b["effect"]) < 1e-4 + 1e-3 * abs(a["effect"])


def test_direct_logit_attribution_and_the_logit_lens_agree(pair):
    native, attached = pair
    clean, _, _ = _inputs()
    a = P.direct_logit_attribution(native, clean, answer=5, wrong=6)
    b = P.direct_logit_attribution(attached, clean, answer=5, wrong=6)
    torch.testing.assert_close(a["heads"], b["heads"], atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(a["mlp"], b["mlp"], atol=1e-4, rtol=1e-3)
    assert abs(b["check"]["sum_of_parts"] - b["check"]["logit_difference"]) < 1e-4
    la, lb = P.logit_lens(native, clean), P.logit_lens(attached, clean)
    assert len(la) == len(lb) == 2
    for x, y in zip(la, lb):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(lb[-1], attached(clean).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["gpt_neox", "phi3", "gpt2", "olmo2"])
def test_direct_logit_attribution_adds_up_or_is_refused(name):
    """Pre-norm blocks (parallel or sequential, LayerNorm or RMSNorm) split exactly; OLMo 2 normalises what its
    blocks add, so its parts cannot add up, and that is refused with the reason."""
    model = ARCHS[name].build()
    hf.attach(model)
    try:
        ids = ARCHS[name].inputs()[0]
        if name == "olmo2":
            with pytest.raises(ValueError, match="does not split into head and MLP outputs"):
                P.direct_logit_attribution(model, ids, answer=5, wrong=6)
            return
        r = P.direct_logit_attribution(model, ids, answer=5, wrong=6)
        assert abs(r["check"]["sum_of_parts"] - r["check"]["logit_difference"]) < 1e-4
        assert r["heads"].shape == (2, 4)
    finally:
        hf.detach(model)


def test_kv_head_scores_agree(pair):
    """The heads a KV cache keeps whole are found the same way on an attached model (its hook_pattern)."""
    from multihead.interpret.kv.heads import echo_and_induction, retrieval_scores
    from multihead.data.needles import Needle

    native, attached = pair
    a = echo_and_induction(native, half=8, batch=2, low=3, start=1)
    b = echo_and_induction(attached, half=8, batch=2, low=3, start=1)
    assert a["echo"].abs().max() > 1e-3
    torch.testing.assert_close(a["echo"], b["echo"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a["induction"], b["induction"], atol=1e-5, rtol=1e-4)
    ids = torch.randint(3, 128, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    needle = Needle(ids=ids, answer=ids[6:9], needle_start=4, needle_end=10, answer_at=6, depth=0.2, city="", number="")
    ra, rb = retrieval_scores(native, [needle]), retrieval_scores(attached, [needle])
    torch.testing.assert_close(ra["retrieval"], rb["retrieval"])
    assert ra["solved"] == rb["solved"]


def test_one_anatomy_describes_both_readings(pair):
    """The anatomy of the native reading and of the attached model: the same sites (heads, key/value groups, head
    size, output projections equal), the same blocks each holding one site and its MLP, the same final norm and
    unembedding; only the source that described them differs."""
    from multihead.modules.anatomy import anatomy

    native, attached = pair
    a, b = anatomy(native), anatomy(attached)
    assert (a.source, b.source) == ("native", "hf")
    assert len(a.sites) == len(b.sites) == len(a.blocks) == len(b.blocks) == 2
    for sa, sb in zip(a.sites, b.sites):
        assert (sa.num_heads, sa.num_kv_heads, sa.head_dim) == (sb.num_heads, sb.num_kv_heads, sb.head_dim)
        assert sa.splits_per_head and sb.splits_per_head
        torch.testing.assert_close(sa.w_o.weight, sb.w_o.weight)
        z = torch.randn(3, sa.num_heads, sa.head_dim)
        torch.testing.assert_close(sa.head_outputs(z), sb.head_outputs(z))  # z_h W_O^h
    assert [blk.sites for blk in a.blocks] == [blk.sites for blk in b.blocks] == [(0,), (1,)]
    assert all(blk.mlp is not None for blk in a.blocks + b.blocks)
    assert [blk.adds for blk in a.blocks] == [True, True] and [blk.adds for blk in b.blocks] == [None, None]
    assert a.final_norm_parts()[0] == b.final_norm_parts()[0] == "rms"
    torch.testing.assert_close(a.final_norm_parts()[1], b.final_norm_parts()[1])
    torch.testing.assert_close(a.unembed.weight, b.unembed.weight)
    torch.testing.assert_close(a.embed.weight, b.embed.weight)
