"""Hostile input to this round's commands: the grounding task (train --data *_qa, show --question), statistics on
long inputs (heads/show --max-len, --concat, --from), compare and bench stats. Each gets a message that names the
fix, exit 2, no traceback, and nothing written or changed."""

import pytest
import torch

from multihead.cli import main
from robust_helpers import refused, run_cli, snapshot

QA = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--set",
    "model.text.d_ff=32",
    "--set",
    "model.vision.encoder.d_model=24",
    "--set",
    "model.vision.encoder.num_layers=1",
    "--set",
    "data.canvases=128",
    "--set",
    "data.validation=16",
    "--set",
    "data.test=32",
    "--epochs",
    "1",
    "--threads",
    "1",
    "--no-progress",
]


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "qa"
    assert main(["train", "--data", "digits_qa", "--out", str(out), *QA]) == 0
    return out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "data.canvases=0"], "data.canvases must be in [1, 10000000]"),
        (["--set", "data.test=0"], "data.test must be in [1, 1000000]"),
        (["--set", "data.limit=3"], "data.limit must be >= 8"),
        (["--set", "model.vision.patch_size=3"], "not divisible by patch_size=3"),
        (["--set", "model.vision.pooling=cls"], "vision.pooling must be mean"),
        (["--set", "model.text.causal=true"], "text.causal must be false"),
        (["--heads", "3"], "text.d_model must be a multiple of text.num_heads"),
        (["--vocab-size", "100"], "do not apply to the grounding task"),
        (["--set", "optim.lr=0"], "optim.lr must be > 0"),
    ],
)
def test_grounding_config_is_checked_before_any_work(tmp_path, args, message):
    out = tmp_path / "run"
    refused(run_cli("train", "--data", "digits_qa", "--out", out, *QA, *args), message)
    assert not out.exists()


def test_missing_fashion_mnist_for_the_grounding_task(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(
        run_cli("train", "--data", "fashion_mnist_qa", "--out", tmp_path / "run", "--set", f"data.path={empty}"),
        "Fashion-MNIST is not installed",
        "apt-get install dataset-fashion-mnist",
    )
    assert not (tmp_path / "run").exists()


def test_grounding_show_and_resume_are_checked(qa_run, tmp_path):
    before = snapshot(qa_run)
    refused(
        run_cli("show", qa_run, "--index", "1", "--question", "where is the cat?", "--out", tmp_path / "a"),
        "CLASS one of: 0, 1",
    )
    refused(
        run_cli("show", qa_run, "--index", "1", "--question", "how many items?", "--out", tmp_path / "b"),
        "ask 'where is the CLASS?'",
    )
    refused(run_cli("show", qa_run, "--index", "10000", "--out", tmp_path / "c"), "outside the test canvases")
    refused(run_cli("show", qa_run, "--out", tmp_path / "d"), "pass --index N")
    refused(run_cli("train", "--data", "digits_qa", "--out", qa_run, *QA), "already holds a run")
    assert snapshot(qa_run) == before and not any((tmp_path / n).exists() for n in "abcd")


def test_long_input_flags_are_checked(tmp_path):
    refused(run_cli("heads", "minilm", "--max-len", "4096", "--n", "1"), "learned positions for 512 tokens")
    refused(
        run_cli("show", "minilm", "hello", "--max-len", "4096", "--out", tmp_path / "s"),
        "learned positions for 512 tokens",
    )
    refused(
        run_cli("heads", "minilm", "--concat", "--n", "100000", "--data", "bbc_headlines"),
        "pass a smaller --n or --max-len",
    )
    refused(run_cli("heads", "minilm", "--from", "map"), "invalid choice")
    refused(run_cli("heads", "minilm", "--max-len", "0"), "--max-len")
    assert not (tmp_path / "s").exists()


def test_compare_checks_every_variant_before_training(tmp_path):
    out = tmp_path / "cmp"
    refused(run_cli("compare", "--variants", "mha,nope", "--out", out), "unknown variants ['nope']")
    refused(run_cli("compare", "--variants", "", "--out", out), "unknown variants")
    refused(run_cli("compare", "--seeds", "0", "--out", out), "--seeds")
    # differential attention rotates each half of a head: head_dim 6 -> halves of 3, odd; mha alone would be fine,
    # and it is refused before mha trains
    refused(
        run_cli("compare", "--variants", "mha,diff", "--d-model", "24", "--heads", "4", "--out", out),
        "need an even head_dim, got 3",
    )
    # parameters cannot be matched when a variant's attention outweighs the whole FFN: refused before training
    refused(
        run_cli(
            "compare",
            "--variants",
            "mha,mla",
            "--d-model",
            "32",
            "--heads",
            "4",
            "--layers",
            "1",
            "--d-ff",
            "4",
            "--out",
            out,
        ),
        "pass a larger --d-ff or --no-match-params",
    )
    assert not out.exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    before = snapshot(other)
    refused(run_cli("compare", "--variants", "mha", "--out", other), "--overwrite")
    assert snapshot(other) == before


def test_bench_stats_rejects_unknown_implementations(tmp_path):
    refused(
        run_cli("bench", "stats", "--impls", "stats,nope", "--out", tmp_path / "x.json"),
        "unknown implementation(s) ['nope']",
    )
    assert not (tmp_path / "x.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_device_flags_are_refused_before_anything_runs(tmp_path):
    out = tmp_path / "b.json"
    refused(run_cli("bench", "attention", "--device", "cuda", "--out", out), "torch.cuda.is_available() is False")
    refused(run_cli("bench", "kernels", "--device", "tpu", "--out", out), "--device must be one of cpu, cuda")
    refused(run_cli("bench", "long", "--dtype", "fp8", "--out", out), "--dtype must be one of fp32, bf16, fp16")
    refused(run_cli("bench", "stats", "--dtype", "bf16", "--out", out), "apply to attention, long, decode, kernels")
    refused(run_cli("bench", "kernels", "--impls", "sdpa,nope", "--out", out), "unknown implementation(s) ['nope']")
    refused(run_cli("bench", "long", "--impls", "nope", "--out", out), "unknown implementation(s) ['nope']")
    assert not out.exists()


@pytest.mark.parametrize("suite", ["kv", "stats", "decode"])
def test_bench_never_replaces_files_already_at_its_out_path_unasked(tmp_path, suite):
    """``bench SUITE --out mine.json`` where the user's ``mine.json``, ``mine.png`` or ``mine.svg`` exist: refused
    before anything runs, every file left as it was (``--overwrite`` replaces them)."""
    for name in ("mine_kv.json", "mine_kv.png", "mine_kv.svg"):
        (tmp_path / name).write_text(f"the user's {name}")
    before = snapshot(tmp_path)
    refused(run_cli("bench", suite, "--out", tmp_path / "mine_kv.json"), "--overwrite")
    assert snapshot(tmp_path) == before
    (tmp_path / "mine_kv.json").unlink()  # a figure alone is enough to refuse
    before = snapshot(tmp_path)
    refused(run_cli("bench", suite, "--out", tmp_path / "mine_kv.json"), "mine_kv.png")
    assert snapshot(tmp_path) == before
