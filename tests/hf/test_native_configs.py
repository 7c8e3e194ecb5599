"""A folder saved by either transformers line reads natively as the model in it: 4.x writes ``rope_theta`` and
``rope_scaling`` at the top of config.json, 5.x writes ``rope_parameters`` (per layer type for Gemma 3). Read with
the 4.x keys alone, a 5.x folder would get the default rotary base: another model, silently."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead import loading  # noqa: E402

from .archs import GQA, TOK  # noqa: E402

SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def _config(name: str):
    if name == "llama":
        cfg = transformers.LlamaConfig(**GQA, **TOK)
        if hasattr(cfg, "rope_parameters"):
            cfg.rope_parameters = {**SCALING, "rope_theta": 5e5}
        else:
            cfg.rope_theta, cfg.rope_scaling = 5e5, dict(SCALING)
        return cfg
    cfg = transformers.Gemma3TextConfig(**GQA, **TOK, head_dim=16, query_pre_attn_scalar=16, sliding_window=4)
    if hasattr(cfg, "rope_parameters"):
        cfg.rope_parameters = {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 2e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 3e3},
        }
    else:
        cfg.rope_theta, cfg.rope_local_base_freq = 2e5, 3e3
        cfg.rope_scaling = {"rope_type": "linear", "factor": 2.0}
    return cfg


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_rotary_settings_of_either_transformers_line_are_read(name, tmp_path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(name)).eval()
    with torch.no_grad():  # weights large enough for the rotary base to matter
        for p in model.parameters():
            p.mul_(4)
    model.save_pretrained(tmp_path, safe_serialization=True)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert ("rope_parameters" in saved) == (int(transformers.__version__.split(".")[0]) >= 5)
    native = loading.load(tmp_path).detail.model
    assert loading.kind(tmp_path).route == "lm"  # multihead's own family, not attached
    ids = torch.randint(3, 128, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(native(ids), model(input_ids=ids).logits, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"rope_type": "default", "rope_theta": "x"}, "rope_theta='x'"),
        ({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}, "'dynamic' is not supported"),
    ],
)
def test_bad_rope_parameters_are_refused_by_name(params, words, tmp_path, capsys):
    from multihead.cli import main

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**GQA, **TOK)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_theta", None)
    cfg.pop("rope_scaling", None)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_parameters": params}))
    out = tmp_path / "out"
    assert main(["heads", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert words in err and "internal error" not in err, err
    assert not out.exists()
