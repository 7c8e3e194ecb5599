"""``multihead patch`` and ``multihead attribute`` end to end on a small random GGUF model, and their messages."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))
from hf_families import hf_model, write_gguf  # noqa: E402

from multihead.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_gguf(hf_model("llama", rope_scaling=None), tmp_path_factory.mktemp("g") / "tiny.gguf"))


def test_patch_writes_effects_and_the_attribution_beside_them(model, tmp_path, capsys):
    out = tmp_path / "patch"
    # " cat" and " heads" are one token each, so the two prompts have the same length
    assert (
        main(
            [
                "patch",
                model,
                "--clean",
                "the cat sat on the",
                "--corrupt",
                "the heads sat on the",
                "--answer",
                " cat",
                "--wrong",
                " heads",
                "--out",
                str(out),
                "--batch",
                "4",
            ]
        )
        == 0
    )
    r = json.loads((out / "importance-patching.json").read_text())
    assert len(r["effect"]) == 2 and len(r["effect"][0]) == 4 and "correlation" in r
    assert (out / "importance.png").stat().st_size > 0
    assert "correlation" in capsys.readouterr().out
    page = (out / "patch.html").read_text()
    assert page.count("<td style='background:") == 2 * 2 * 4  # exact and attribution grids: 2 layers x 4 heads
    first = f"L0H0: {r['effect'][0][0]:+.4f}; attribution {r['attribution'][0][0]:+.4f}"
    assert first in page and "the heads sat on the" in page and "<script" not in page


def test_the_page_escapes_what_it_shows(tmp_path):
    from multihead.interpret.causal.patch_page import write_patch_page

    evil = "<img src=x onerror=alert(1)>"
    result = {
        "model": evil,
        "metric": "logit-diff",
        "effect": [[[0.5, -1.0], [0.0, 0.25]]],
        "pairs": [{"clean": evil, "corrupt": evil, "answer": " a", "wrong": " b"}],
        "per_pair": [{"clean": 1.0, "corrupt": 0.0}],
    }
    write_patch_page(tmp_path / "p.html", result, tokens=[evil, "b"])
    page = (tmp_path / "p.html").read_text()
    assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    # per position: the grid shows each head's largest effect over positions, with its sign
    assert "L0H0: -1.0000" in page and "L0H1: +0.2500" in page


def test_patch_from_a_file_with_positions(model, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": "the cat sat", "corrupt": "the heads sat", "answer": " on"}) + "\n")
    out = tmp_path / "p"
    assert main(["patch", model, "--file", str(pairs), "--metric", "prob", "--positions", "--out", str(out)]) == 0
    r = json.loads((out / "importance-patching.json").read_text())
    assert len(r["effect"][0][0]) == 5  # a value per position of the 5-token prompt (BOS included)


def test_patch_names_bad_input(model, tmp_path, capsys):
    base = ["patch", model, "--out", str(tmp_path / "x"), "--answer", " cat", "--wrong", " heads"]
    assert main(base + ["--clean", "the cat sat on the mat", "--corrupt", "the cat"]) == 2
    assert "tokens" in capsys.readouterr().err  # both lengths named
    assert main(base[:4] + ["--clean", "a", "--corrupt", "b", "--answer", " attention heads", "--wrong", " cat"]) == 2
    assert "must be one token" in capsys.readouterr().err
    assert main(base[:4] + ["--clean", "a", "--corrupt", "b", "--answer", " cat"]) == 2
    assert "--wrong" in capsys.readouterr().err


def test_attribute_prints_parts_that_add_up(model, capsys):
    assert main(["attribute", model, "the cat sat on the", "--answer", " heads", "--wrong", " cat", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    r = json.loads(lines[-1])
    assert abs(r["check"]["sum_of_parts"] - r["check"]["logit_difference"]) < 1e-3
