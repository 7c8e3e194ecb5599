"""AttentionConfig: the one place a stack's attention is chosen. Nested in the encoder and decoder configs, built by
one factory, impossible combinations refused when the config is made (never silently ignored), and the flat fields of
older config.json files and ``--set`` keys read into it."""

import pytest
import torch

from multihead._config import ConfigError
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules import DifferentialAttention, MultiHeadAttention, MultiHeadLatentAttention, TalkingHeadsAttention
from multihead.modules.decoder import DecoderConfig
from multihead.modules.encoder import EncoderConfig, TransformerEncoder
from multihead.modules.variants import AttentionConfig
from multihead.train.pretrain import config_from_overrides


@pytest.mark.parametrize(
    "options,cls",
    [
        (dict(), MultiHeadAttention),
        (dict(gate=True), MultiHeadAttention),
        (dict(differential=True), DifferentialAttention),
        (dict(talking_heads=True), TalkingHeadsAttention),
        (dict(mla_latent=8, sinks=True, alibi=True), MultiHeadLatentAttention),
    ],
)
def test_the_factory_builds_the_class_of_the_config(options, cls):
    m = AttentionConfig(**options).build(32, 4)
    assert type(m) is cls and m.num_heads == 4


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(differential=True, talking_heads=True), "cannot be combined"),
        (dict(sinks=True, talking_heads=True), "sink_logits would never be used"),
        (dict(mla_latent=8, gate=True), "does not take gate"),
        (dict(pattern={"window": 4}, sinks=True), "sparse pattern"),
    ],
)
def test_combinations_that_cannot_train_are_refused_when_the_config_is_made(options, message):
    with pytest.raises(ValueError, match=message):
        AttentionConfig(**options)
    with pytest.raises(ConfigError, match=message):  # from JSON or --set: a config error naming the reason
        DecoderConfig.from_dict({"attention": options})


def test_an_encoder_refuses_mla_and_a_decoder_refuses_a_pattern():
    with pytest.raises(ValueError, match="an encoder has no cache"):
        EncoderConfig(attention=AttentionConfig(mla_latent=8))
    with pytest.raises(ValueError, match="drop attention.pattern"):
        DecoderConfig(attention=AttentionConfig(pattern={"window": 4}))


def test_older_flat_fields_are_read_into_the_nested_config():
    old = {
        "d_model": 32,
        "num_heads": 4,
        "num_layers": 1,
        "num_kv_heads": 2,
        "attn_dropout": 0.1,
        "backend": "sdpa",
        "gate": True,
        "sinks": True,
        "mla_latent": 0,
        "cross_attention": False,
    }
    cfg = DecoderConfig.from_dict(old)
    assert cfg.attention == AttentionConfig(num_kv_heads=2, dropout=0.1, backend="sdpa", gate=True, sinks=True)
    assert "gate" not in cfg.to_dict() and cfg.to_dict()["attention"]["gate"] is True
    assert DecoderConfig.from_dict(cfg.to_dict()) == cfg  # the new form round-trips
    enc = EncoderConfig.from_dict({"d_model": 32, "num_heads": 4, "pattern": {"window": 8}, "num_kv_heads": 1})
    assert enc.attention.pattern == {"window": 8} and enc.attention.num_kv_heads == 1
    assert TransformerEncoder(d_model=32, num_heads=4, num_kv_heads=2).layers[0].attn.num_kv_heads == 2


def test_set_keys_old_and_new_give_one_config():
    old = config_from_overrides(
        {"objective": {"name": "clm"}, "causal": {"decoder": {"gate": True, "num_kv_heads": 2}}}
    )
    new = config_from_overrides(
        {"objective": {"name": "clm"}, "causal": {"decoder": {"attention": {"gate": True, "num_kv_heads": 2}}}}
    )
    assert old.causal.decoder == new.causal.decoder and new.causal.decoder.attention.gate
    with pytest.raises(ConfigError, match="num_kv_heads"):
        config_from_overrides({"objective": {"name": "clm"}, "causal": {"decoder": {"attention": {"num_kv_heads": 0}}}})


def test_a_causal_lm_built_from_the_nested_config_equals_the_flat_one():
    flat = {
        "vocab_size": 40,
        "max_len": 16,
        "positional": "alibi",
        "decoder": {
            "d_model": 32,
            "num_heads": 4,
            "num_layers": 2,
            "d_ff": 64,
            "dropout": 0.0,
            "cross_attention": False,
            "norm_first": True,
            "num_kv_heads": 2,
            "sinks": True,
        },
    }
    torch.manual_seed(0)
    a = CausalLM(CausalLMConfig.from_dict(flat)).eval()
    torch.manual_seed(0)
    b = CausalLM(CausalLMConfig.from_dict(CausalLMConfig.from_dict(flat).to_dict())).eval()
    assert a.config.decoder.attention.alibi  # positional="alibi" sets it
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(a(ids), b(ids), atol=0, rtol=0)
