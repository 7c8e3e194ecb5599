"""The decoder parts pretrained LMs brought (RMSNorm, SwiGLU, rope theta and scaling, head_dim, QK-norm, separate
biases) are options of the same configs: they round-trip through JSON, refuse bad values, and train."""

import pytest
import torch

from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig
from multihead.modules.variants import AttentionConfig


def _config(**decoder):
    base = dict(
        d_model=32,
        num_heads=4,
        num_layers=2,
        cross_attention=False,
        norm_first=True,
        dropout=0.0,
        norm="rms",
        activation="swiglu",
        bias=True,
        out_bias=False,
        ffn_bias=False,
        rope_theta=5e4,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        attention=AttentionConfig(num_kv_heads=2, head_dim=12, qk_norm=True),
    )
    return CausalLMConfig(vocab_size=50, max_len=64, positional="rope", decoder=DecoderConfig(**{**base, **decoder}))


def test_new_fields_round_trip_through_json():
    c = _config()
    again = CausalLMConfig.from_dict(c.to_dict())
    assert again == c and again.decoder.attention.head_dim == 12


def test_every_new_part_gets_gradients_and_the_loss_falls():
    torch.manual_seed(0)
    model = CausalLM(_config())
    ids = torch.randint(0, 50, (8, 24))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        if not losses:
            silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
            assert silent == []  # q_norm, k_norm, w_gate, the RMSNorm weights: all in the graph
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"norm": "batch"}, "unknown norm"),
        ({"activation": "swish_glu"}, "unknown activation"),
        ({"rope_theta": 0.5}, "rope theta"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, "factor"),
    ],
)
def test_bad_values_are_refused_when_the_config_is_made(change, message):
    with pytest.raises(ValueError, match=message):
        _config(**change)
