"""DDP: 2 CPU processes (gloo, loopback) hold identical parameters and match one process with the same global batch.

Tolerance: DDP averages per-rank gradients in a different float32 summation order than one process summing the
whole batch, and AdamW divides by sqrt(v) which amplifies tiny differences for rarely-updated weights, so the two
trainings agree to float32 round-off scale, not bitwise. We assert parameters within 1e-5 absolute after 1 epoch
(measured: at most 3e-7) and identical validation and test predictions.

One exception, by design: the key projection's bias. It adds ``q . b_k`` to every score of a query row, which the
softmax cancels, so its gradient is exactly zero in exact arithmetic; what reaches it is round-off noise, which AdamW
normalises into learning-rate-sized steps (measured 2e-4 apart). It is compared only for finiteness.
"""

import json
import socket
import subprocess
import sys

import torch
from safetensors.torch import load_file

ARGS = [
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
    "--epochs",
    "1",
    "--batch-size",
    "16",
    "--dropout",
    "0",
    "--patience",
    "0",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_matches_single_process(tmp_path, sentiment_csv):
    ddp_out, single_out = tmp_path / "ddp", tmp_path / "single"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "multihead.cli",
        "train",
        "--data",
        str(sentiment_csv),
        "--out",
        str(ddp_out),
        "--device",
        "cpu",
        *ARGS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "multihead.cli", "train", "--data", str(sentiment_csv), "--out", str(single_out), *ARGS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    ddp = json.loads((ddp_out / "results.json").read_text())
    single = json.loads((single_out / "results.json").read_text())
    assert ddp["distributed"]["world_size"] == 2 and ddp["distributed"]["backend"] == "gloo"
    assert ddp["distributed"]["max_param_diff_across_ranks"] == 0.0  # replicas identical
    wa, wb = load_file(str(ddp_out / "model.safetensors")), load_file(str(single_out / "model.safetensors"))
    compared = [k for k in wa if not k.endswith("attn.w_k.bias")]
    diff = max((wa[k] - wb[k]).abs().max().item() for k in compared)
    assert diff < 1e-5, f"DDP and single-process parameters differ by {diff}"
    assert all(torch.isfinite(wa[k]).all() for k in wa)
    assert ddp["validation"]["accuracy"] == single["validation"]["accuracy"]
    assert ddp["test"]["confusion"] == single["test"]["confusion"]
    assert (ddp_out / "metrics.jsonl").read_text().count('"eval"') == 1  # rank 0 logs, once
