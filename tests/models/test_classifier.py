"""TransformerClassifier: the tutorial's signature, masked pooling, configs through JSON."""

import json

import pytest
import torch

import multihead as mh


def test_tutorial_signature_and_defaults():
    model = mh.TransformerClassifier()  # vocab 10000, d_model 512, 8 heads, 2 layers, 10 classes
    cfg = model.config
    assert (cfg.vocab_size, cfg.encoder.d_model, cfg.encoder.num_heads, cfg.encoder.num_layers, cfg.num_classes) == (
        10000,
        512,
        8,
        2,
        10,
    )
    x = torch.randint(1, 10000, (2, 12))
    assert model(x).shape == (2, 10)


def test_padding_does_not_change_logits():
    """The tutorial's x.mean(dim=1) averages padding too; ours pools real tokens only."""
    model = mh.TransformerClassifier(vocab_size=50, d_model=32, heads=4, num_layers=2, num_classes=3).eval()
    ids = torch.randint(1, 50, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(ids), model(padded), rtol=0, atol=1e-5)
    # an explicit attention_mask does the same
    torch.testing.assert_close(model(padded, attention_mask=padded != 0), model(ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "none"])
@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_variants_train_a_step(positional, pooling):
    model = mh.TransformerClassifier(
        vocab_size=30,
        d_model=16,
        heads=2,
        num_layers=1,
        num_classes=2,
        positional=positional,
        pooling=pooling,
        norm_first=positional == "rope",
    )
    ids = torch.randint(1, 30, (4, 9))
    loss = torch.nn.functional.cross_entropy(model(ids), torch.tensor([0, 1, 0, 1]))
    loss.backward()
    assert torch.isfinite(loss) and model.embed.weight.grad is not None


def test_config_json_round_trip():
    model = mh.TransformerClassifier(
        vocab_size=100,
        d_model=32,
        heads=4,
        num_layers=1,
        num_classes=5,
        positional="learned",
        pooling="cls",
        num_kv_heads=2,
        activation="gelu",
    )
    text = model.config.to_json()
    again = mh.ClassifierConfig.from_json(text)
    assert again == model.config
    clone = mh.TransformerClassifier.from_config(json.loads(text))
    clone.load_state_dict(model.state_dict())
    ids = torch.randint(1, 100, (2, 5))
    model.eval(), clone.eval()
    torch.testing.assert_close(model(ids), clone(ids))


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="unknown ClassifierConfig fields"):
        mh.ClassifierConfig.from_dict({"vocab": 3})
    with pytest.raises(ValueError, match="choose one of"):
        mh.TransformerClassifier(pooling="attention")
    model = mh.TransformerClassifier(vocab_size=20, d_model=8, heads=2, num_layers=1, num_classes=2, max_len=8)
    with pytest.raises(ValueError, match="truncate"):
        model(torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        model(torch.ones(1, 4))


def test_head_mask_reaches_every_layer():
    model = mh.TransformerClassifier(vocab_size=20, d_model=16, heads=4, num_layers=2, num_classes=2).eval()
    ids = torch.randint(1, 20, (3, 5))
    hm = torch.ones(2, 4, requires_grad=True)
    model(ids, head_mask=hm).sum().backward()
    assert (hm.grad != 0).all()
