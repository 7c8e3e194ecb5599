"""A model dispatched by accelerate with CPU and disk offload (as users run models larger than memory): attached,
it gives the same patterns, head ablations, activation patching and direct logit attribution as the same weights
held in memory, through either source (HF's registry, or observation)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")
pytest.importorskip("accelerate", reason="pip install accelerate")

from multihead import hf  # noqa: E402
from multihead.interpret.causal import patching as P  # noqa: E402
from multihead.modules import capture  # noqa: E402

from .archs import ARCHS  # noqa: E402

# embeddings, layer 0, the final norm and the head on the CPU; layer 1 on disk (its weights on the meta device between
# forwards, loaded by accelerate's hooks for each one)
DEVICE_MAP = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}


def _readings(model, ids, corrupt) -> dict:
    with torch.no_grad(), capture(model, ("pattern",)) as cache:
        model(ids)
    with P.ablated(model, {1: [2]}), torch.no_grad():
        ablated = model(ids).logits
    return {
        "patterns": cache.patterns(),
        "ablated": ablated,
        "patched": P.activation_patching(model, ids, corrupt, P.logit_diff(5, 6))["effect"],
        "dla": P.direct_logit_attribution(model, ids, answer=5, wrong=6)["heads"],
    }


@pytest.mark.parametrize("source", ["registry", "observed"])
def test_an_offloaded_model_reads_as_the_one_in_memory(source, tmp_path):
    import transformers

    arch = ARCHS["llama"]
    here = arch.build()
    here.save_pretrained(tmp_path / "model")
    offloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "model", device_map=DEVICE_MAP, offload_folder=tmp_path / "offload", dtype=torch.float32
    ).eval()
    assert offloaded.model.layers[1].self_attn.o_proj.weight.device.type == "meta"  # on disk, truly
    ids = arch.inputs()[0]
    corrupt = ids.clone()
    corrupt[0, 3] = (corrupt[0, 3] + 11) % 128
    readings = {}
    for key, model in (("memory", here), ("offloaded", offloaded)):
        hf.attach(model, source=source)
        try:
            readings[key] = _readings(model, ids, corrupt)
        finally:
            hf.detach(model)
    a, b = readings["memory"], readings["offloaded"]
    for x, y in zip(a["patterns"], b["patterns"], strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)
    for key in ("ablated", "patched", "dla"):
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5)
    assert a["patched"].abs().max() > 1e-3 and a["dla"].abs().max() > 1e-3  # the readings are not all zero
    assert offloaded.model.layers[1].self_attn.o_proj.weight.device.type == "meta"  # offloaded again afterwards
