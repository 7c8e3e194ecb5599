"""One model two ways: an HF Llama (GQA) read natively into multihead's CausalLM, and the same HF model attached.
Every intervention of multihead.interpret.patching gives the same numbers on both (the native one resumes from the
patched layer and projects one position; the attached one reruns HF's model)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf, lm  # noqa: E402
from multihead.interpret import patching as P  # noqa: E402

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
