"""The CLI end to end on a small file: train, evaluate, predict, resume after SIGKILL, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from multihead.cli import main
from multihead.train import CheckpointError, load_run

SMALL = [
    "--d-model",
    "32",
    "--heads",
    "4",
    "--layers",
    "1",
    "--d-ff",
    "64",
    "--max-len",
    "32",
    "--vocab-size",
    "200",
    "--text-column",
    "sentence",
    "--label-column",
    "sentiment",
    "--threads",
    "1",
    "--no-progress",
]


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "multihead.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, sentiment_csv):
    out = tmp_path_factory.mktemp("runs") / "small"
    assert (
        main(["train", "--data", str(sentiment_csv), "--out", str(out), "--epochs", "6", "--lr", "3e-3", *SMALL]) == 0
    )
    return out


def test_run_folder_contents(trained_run):
    names = {p.name for p in trained_run.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "labels.json",
        "metrics.jsonl",
        "splits.json",
        "results.json",
        "curves.png",
        "confusion.png",
        "checkpoint",
    } <= names
    results = json.loads((trained_run / "results.json").read_text())
    assert results["test"]["accuracy"] >= 0.9  # the task is easy: 2 of ~10 words decide the label
    assert results["baseline_tfidf_logreg"]["test_accuracy"] > 0.5
    config = json.loads((trained_run / "config.json").read_text())["train"]
    assert config["model"]["encoder"]["d_model"] == 32 and config["data"]["label_column"] == "sentiment"
    events = [json.loads(x) for x in (trained_run / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert 1 <= len(evals) <= 6 and all("tokens_per_second" in e and e["threads"] == 1 for e in evals)
    assert json.loads((trained_run / "labels.json").read_text()) == ["negative", "positive"]


def test_evaluate_and_predict(trained_run, capsys):
    assert main(["evaluate", str(trained_run), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    results = json.loads((trained_run / "results.json").read_text())
    assert ev["accuracy"] == pytest.approx(results["test"]["accuracy"]) and ev["split"] == "test"
    assert main(["predict", str(trained_run), "a great superb film", "an awful dull film", ""]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["label"] for r in rows[:2]] == ["positive", "negative"]
    assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-4 for r in rows)


def test_predict_from_file(trained_run, tmp_path, capsys):
    f = tmp_path / "in.jsonl"
    f.write_text('{"text": "lovely fine story"}\n{"text": "poor weak plot"}\n')
    assert main(["predict", str(trained_run), "--file", str(f)]) == 0
    assert [json.loads(x)["label"] for x in capsys.readouterr().out.splitlines()] == ["positive", "negative"]


def test_bad_input_errors(trained_run, sentiment_csv, tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "--data", str(sentiment_csv), "--out", str(tmp_path / "r"), "--text-column", "body"]) == 2
    assert "no column 'body'" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_text("sentence,sentiment\n")
    assert main(["train", "--data", str(empty), "--out", str(tmp_path / "r"), *SMALL]) == 2
    assert "empty" in capsys.readouterr().err
    other = tmp_path / "other.csv"
    other.write_text("sentence,sentiment\nfoo,neutral\nbar,positive\n")
    assert main(["evaluate", str(trained_run), "--data", str(other), "--split", "all"]) == 2
    assert "['neutral'] in" in capsys.readouterr().err
    assert main(["train", "--data", str(sentiment_csv), "--out", str(trained_run), *SMALL]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "no_run")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_truncated_and_tampered_checkpoints_are_refused(trained_run, tmp_path):
    import shutil

    for damage in ("truncate", "tamper"):
        run = tmp_path / damage
        shutil.copytree(trained_run, run)
        f = run / "model.safetensors"
        data = bytearray(f.read_bytes())
        if damage == "truncate":
            f.write_bytes(bytes(data[: len(data) // 2]))
            match = "truncated or corrupt"
        else:
            data[-8] ^= 0xFF  # flip bits inside the last tensor
            f.write_bytes(bytes(data))
            match = "modified after it was written"
        with pytest.raises(CheckpointError, match=match):
            load_run(run)


def test_toml_config_and_overrides(tmp_path, sentiment_csv):
    from multihead.cli import build_parser, train_config_from_args

    toml = tmp_path / "c.toml"
    toml.write_text("[optim]\nepochs = 7\nlr = 0.0005\n[model.encoder]\nd_model = 48\nnum_heads = 6\n")
    args = build_parser().parse_args(
        [
            "train",
            "--out",
            "x",
            "--config",
            str(toml),
            "--lr",
            "0.002",
            "--set",
            "optim.label_smoothing=0.1",
            "--data",
            str(sentiment_csv),
        ]
    )
    c = train_config_from_args(args)
    assert (c.optim.epochs, c.optim.lr, c.optim.label_smoothing) == (7, 0.002, 0.1)
    assert (c.model.encoder.d_model, c.model.encoder.num_heads, c.data.name) == (48, 6, str(sentiment_csv))
    toml.write_text("[optim]\nepochz = 3\n")
    args = build_parser().parse_args(["train", "--out", "x", "--config", str(toml)])
    with pytest.raises(ValueError, match="unknown optim fields"):
        train_config_from_args(args)


def test_resume_after_sigkill_matches_uninterrupted(tmp_path, sentiment_csv):
    common = [
        "--data",
        sentiment_csv,
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--save-every",
        "5",
        "--lr",
        "3e-3",
        "--patience",
        "0",
        *SMALL,
    ]
    full = tmp_path / "full"
    proc = cli("train", "--out", full, *common)
    assert proc.returncode == 0, proc.stderr

    killed = tmp_path / "killed"
    p = subprocess.Popen(
        [sys.executable, "-m", "multihead.cli", "train", "--out", str(killed), *map(str, common)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = killed / "checkpoint" / "state.json"
    deadline = time.time() + 120
    while time.time() < deadline:  # wait for a mid-epoch checkpoint of the second epoch
        if state.exists():
            try:
                s = json.loads(state.read_text())
            except ValueError:
                s = {}
            if s.get("epoch") == 1 and s.get("batch", 0) > 0:
                break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (killed / "results.json").exists(), "the run finished before it could be killed"
    proc = cli("train", "--out", killed, "--resume", *common)
    assert proc.returncode == 0, proc.stderr
    assert "resuming" in proc.stdout
    a = json.loads((full / "results.json").read_text())
    b = json.loads((killed / "results.json").read_text())
    assert a["test"] == b["test"] and a["validation"] == b["validation"] and a["best_epoch"] == b["best_epoch"]
    from safetensors.torch import load_file

    wa, wb = load_file(str(full / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    evals = lambda run: [
        json.loads(x)["val_accuracy"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x
    ]
    assert evals(full) == evals(killed)


def test_resume_without_checkpoint_says_so(tmp_path, sentiment_csv, capsys):
    assert main(["train", "--data", str(sentiment_csv), "--out", str(tmp_path / "none"), "--resume", *SMALL]) == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_svd_embeddings_are_deterministic_unit_rows():
    from multihead.train.trainer import svd_embeddings

    ids = [[2, 5, 6, 3], [2, 5, 7, 3], [2, 8, 9, 6, 3], [2, 7, 8, 3]] * 5
    a = svd_embeddings(ids, vocab_size=12, dim=4, seed=0)
    b = svd_embeddings(ids, vocab_size=12, dim=4, seed=0)
    assert torch.equal(a, b) and a.shape == (12, 4)
    norms = a.norm(dim=1)
    used = torch.tensor([i in {2, 3, 5, 6, 7, 8, 9} for i in range(12)])
    torch.testing.assert_close(norms[used], torch.ones(int(used.sum())))
    assert (norms[~used] == 0).all()  # never-seen tokens keep their random init (the caller skips zero rows)
    # tokens that always occur together get the same direction
    together = svd_embeddings([[4, 5], [4, 5], [6, 7], [6, 7, 8]], vocab_size=9, dim=2, seed=0)
    torch.testing.assert_close(together[4], together[5])
