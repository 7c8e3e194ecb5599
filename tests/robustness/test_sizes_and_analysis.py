"""Hostile sizes are refused before anything is allocated (defect 8); analysis works on valid but unusual inputs:
pruned layers, text that looks like maths, long texts (defect 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from robust_helpers import refused, run_cli, snapshot


def _edit_config(run: Path, section: str, **values) -> None:
    cfg = json.loads((run / "config.json").read_text())
    target = cfg["train"]["model"]
    for key in section.split(".")[1:] if section != "model" else []:
        target = target[key]
    target.update(values)
    (run / "config.json").write_text(json.dumps(cfg))


# ---------------------------------------------------------------------------------------------------- 8. sizes
@pytest.mark.parametrize(
    "section, values, fragment",
    [
        ("model.encoder", {"num_layers": 10**6}, "MULTIHEAD_MAX_LAYERS"),
        ("model", {"vocab_size": 10**7}, "MULTIHEAD_MAX_VOCAB"),
        ("model", {"num_classes": 10**6}, "MULTIHEAD_MAX_CLASSES"),
        ("model.encoder", {"num_layers": 500}, "does not fit"),  # under the ceiling: the weights' header decides
        ("model.encoder", {"d_model": 4096}, "wrong shape"),
    ],
)
def test_hostile_run_config_is_refused_before_building(run_copy, section, values, fragment):
    _edit_config(run_copy, section, **values)
    before = snapshot(run_copy)
    refused(run_cli("predict", run_copy, "good"), fragment)
    assert snapshot(run_copy) == before


def test_ceilings_are_configurable(run_copy):
    refused(run_cli("predict", run_copy, "good", env={"MULTIHEAD_MAX_LAYERS": "1"}), "MULTIHEAD_MAX_LAYERS")
    refused(run_cli("predict", run_copy, "good", env={"MULTIHEAD_MAX_PARAMETERS": "1000"}), "MULTIHEAD_MAX_PARAMETERS")
    assert run_cli("predict", run_copy, "good", env={"MULTIHEAD_MAX_LAYERS": "2"}).returncode == 0


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"num_hidden_layers": 10**6}, "MULTIHEAD_MAX_LAYERS"),
        ({"vocab_size": 10**7}, "MULTIHEAD_MAX_VOCAB"),
        ({"num_hidden_layers": 5}, "disagree"),
        ({"hidden_size": 768}, "wrong shape"),
        ({"vocab_size": "many"}, "positive integers"),
    ],
)
def test_hostile_hf_config_is_refused_before_building(tmp_path, values, fragment):
    from multihead import pretrained

    src = pretrained.resolve("minilm")
    folder = tmp_path / "hf"
    folder.mkdir()
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).write_bytes((src / name).read_bytes())
    (folder / "model.safetensors").symlink_to(src / "model.safetensors")
    cfg = {**json.loads((src / "config.json").read_text()), **values}
    (folder / "config.json").write_text(json.dumps(cfg))
    refused(run_cli("embed", folder, "hello"), fragment)


def test_confusion_plot_stays_small_for_many_classes(tmp_path):
    import random

    import matplotlib.image

    from multihead.train.metrics import plot_confusion

    rng = random.Random(0)
    for k in (3, 100, 500):
        m = [[rng.randint(0, 9) for _ in range(k)] for _ in range(k)]
        path = tmp_path / f"c{k}.png"
        plot_confusion(m, [f"class {i}" for i in range(k)], path, f"{k} classes")
        h, w = matplotlib.image.imread(path).shape[:2]
        assert h <= 16 * 110 and w <= 16 * 110, (k, h, w)


# ---------------------------------------------------------------------------------------------------- 10. analysis
@pytest.fixture
def layer_pruned_run(run_copy, tmp_path) -> Path:
    """The run with every head of layer 0 and head 1 of layer 1 pruned physically, as `prune` writes it."""
    from multihead._io import Publish
    from multihead.heads.prune import write_pruned_run
    from multihead.train import load_run

    out = tmp_path / "pruned"
    with Publish(out, "run") as folder:
        write_pruned_run(load_run(run_copy), {0: [0, 1], 1: [1]}, folder, {})
    return out


def test_show_heads_importance_on_a_run_with_a_pruned_layer(layer_pruned_run, data_csv, tmp_path):
    proc = run_cli("show", layer_pruned_run, "a good film", "--out", tmp_path / "show")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "show" / "grid.png").is_file() and (tmp_path / "show" / "attention.html").is_file()
    proc = run_cli(
        "heads",
        layer_pruned_run,
        "--data",
        data_csv,
        "--text-column",
        "sentence",
        "--label-column",
        "sentiment",
        "--n",
        "20",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["heads"]) == 1  # the one head left
    for method in ("michel", "confidence", "loo"):
        proc = run_cli("importance", layer_pruned_run, "--method", method, "--n", "20")
        assert proc.returncode == 0, proc.stderr
        scores = json.loads((layer_pruned_run / "importance" / f"importance-{method}.json").read_text())["scores"]
        assert scores[0] == [None, None] and scores[1][1] is None and scores[1][0] is not None


def test_importance_of_a_pruned_model_equals_the_masked_model(run_copy, tmp_path):
    """A head pruned away scores nothing; the others score as in the unpruned model with that head masked."""
    import copy

    import torch

    from multihead.heads.scores import importance
    from multihead.train import load_run
    from multihead.train.inference import examples

    run = load_run(run_copy)
    _, parts = examples(run, splits=("validation",))
    ids, labels, _ = parts["validation"]
    mask = torch.ones(2, 2)
    mask[0, :] = 0
    mask[1, 1] = 0
    masked = importance(run.model, ids, labels, "loo", mask)
    pruned_model = copy.deepcopy(run.model)
    pruned_model.encoder.prune_heads({0: [0, 1], 1: [1]})
    pruned = importance(pruned_model, ids, labels, "loo")
    assert torch.isnan(pruned[0]).all() and torch.isnan(pruned[1, 1])
    assert torch.allclose(pruned[1, 0], masked[1, 0], atol=1e-5)


@pytest.mark.parametrize("text", ["$\\frac{a}$ is broken", "cost $5 and $10", "a_b^c $x"])
def test_show_draws_dollar_text_literally(trained_run, tmp_path, text):
    proc = run_cli("show", trained_run, text, "--out", tmp_path / "show")
    assert proc.returncode == 0, proc.stderr


def test_plain_text_is_never_mathtext():
    from matplotlib.text import Text

    from multihead.plotting import plain

    for s in ("cost $5 and $10", "$\\frac{a}$", "a \\$ b", "no dollars", "$x$"):
        shown, is_math = Text(text=plain(s))._preprocess_math(plain(s))
        assert (shown, is_math) == (s, False)


def test_show_reports_truncation(trained_run, tmp_path):
    text = " ".join(["word"] * 2000)
    proc = run_cli("show", trained_run, text, "--out", tmp_path / "show", "--no-rollout")
    assert proc.returncode == 0, proc.stderr
    assert "more tokens than the model's" in proc.stdout


def test_show_refuses_empty_text_and_a_run_folder_as_out(trained_run, tmp_path):
    refused(run_cli("show", trained_run, "   ", "--out", tmp_path / "s"), "empty")
    before = snapshot(trained_run)
    refused(run_cli("show", trained_run, "good", "--out", trained_run), "folder being read")
    assert snapshot(trained_run) == before
