"""An HF model observed at the function level (:mod:`multihead.modules.observe`) instead of attached through HF's
attention registry: the same patterns as HF eager's and the same activation patching as the attached model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import hf  # noqa: E402
from multihead.interpret import patching as P  # noqa: E402
from multihead.modules.capture import capture  # noqa: E402
from multihead.modules.observe import observe, unobserve  # noqa: E402

from .archs import ARCHS  # noqa: E402


def test_an_hf_model_observed_gives_hf_eager_attentions_and_the_attached_patching():
    """An HF Llama in its sdpa mode, observed (not attached): every pattern equals HF eager's output_attentions,
    and activation patching of every head equals that of the same model attached through HF's registry."""
    arch = ARCHS["llama"]
    model = arch.build()
    ids = arch.inputs()[0]
    with torch.no_grad():
        eager = arch.build()
        eager.set_attn_implementation("eager")
        want = eager(ids, output_attentions=True).attentions
    observe(model, ids)
    corrupt = ids.clone()
    corrupt[0, 3] = (corrupt[0, 3] + 11) % 128
    metric = P.logit_diff(5, 6)
    try:
        with torch.no_grad(), capture(model) as cache:
            model(ids)
        for got, w in zip(cache.patterns(), want):
            torch.testing.assert_close(got, w, atol=1e-6, rtol=1e-5)
        observed = P.activation_patching(model, ids, corrupt, metric)["effect"]
    finally:
        unobserve(model)
    hf.attach(model)
    try:
        attached = P.activation_patching(model, ids, corrupt, metric)["effect"]
    finally:
        hf.detach(model)
    assert observed.abs().max() > 1e-4
    torch.testing.assert_close(observed, attached, atol=1e-5, rtol=1e-4)
