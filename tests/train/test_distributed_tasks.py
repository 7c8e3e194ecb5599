"""Every task runs under ``torchrun`` on the one run harness: 2 CPU processes (gloo, loopback) end with the weights
one process reaches on the same global batches, within 1e-5 (float32 summation order differs; see
``test_distributed.py`` for why the key projection's bias is only checked for finiteness). Dropout is off: each rank
draws its own dropout masks."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from test_distributed import free_port

TASKS = {
    "g2p": [
        "--data",
        "cmudict",
        "--limit",
        "200",
        "--eval-limit",
        "200",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--layers",
        "1",
        "--d-ff",
        "64",
        "--dropout",
        "0",
        "--set",
        "run.eval_words=20",
        "--set",
        "data.test_limit=20",
        "--set",
        "run.beam=1",
    ],
    "vision": [
        "--data",
        "digits",
        "--epochs",
        "1",
        "--d-model",
        "32",
        "--heads",
        "4",
        "--layers",
        "1",
        "--set",
        "model.encoder.d_ff=64",
        "--set",
        "model.patch_size=2",
        "--set",
        "model.stem_channels=16",
        "--batch-size",
        "64",
        "--dropout",
        "0",
        "--set",
        "run.baseline=false",
        "--set",
        "data.limit=512",
        "--set",
        "data.eval_limit=512",
    ],
    "grounding": [
        "--data",
        "digits_qa",
        "--epochs",
        "1",
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
        "data.canvases=256",
        "--set",
        "data.validation=32",
        "--set",
        "data.test=64",
        "--batch-size",
        "64",
    ],
    "clm": [
        "--objective",
        "clm",
        "--data",
        "imdb",
        "--limit",
        "120",
        "--steps",
        "12",
        "--eval-every",
        "6",
        "--seq-len",
        "32",
        "--vocab-size",
        "300",
        "--batch-size",
        "8",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--layers",
        "1",
        "--d-ff",
        "64",
        "--dropout",
        "0",
    ],
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_two_processes_match_one(task, tmp_path):
    verb = "pretrain" if task == "clm" else "train"
    common = [verb, *TASKS[task], "--threads", "1", "--no-progress"]
    ddp_out, single_out = tmp_path / "ddp", tmp_path / "single"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            "-m",
            "multihead.cli",
            *common,
            "--out",
            str(ddp_out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "multihead.cli", *common, "--out", str(single_out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    ddp = json.loads((ddp_out / "results.json").read_text())
    assert ddp["distributed"]["world_size"] == 2 and ddp["distributed"]["max_param_diff_across_ranks"] == 0.0

    def weights(run):
        state = json.loads((run / "checkpoint" / "state.json").read_text())
        assert state["world_size"] == (2 if run == ddp_out else 1)
        return {k: v for k, v in load_file(str(run / "checkpoint" / state["file"])).items() if k.startswith("model.")}

    wa, wb = weights(ddp_out), weights(single_out)
    assert wa.keys() == wb.keys()
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa if not k.endswith("w_k.bias"))
    assert diff < 1e-5, f"{task}: 2 processes and 1 differ by {diff}"
    assert all(torch.isfinite(v).all() for v in wa.values())
    # the same number of optimizer steps, logged once (rank 0)
    steps = [json.loads(x)["step"] for x in (ddp_out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [json.loads(x)["step"] for x in (single_out / "metrics.jsonl").read_text().splitlines()]


def test_resume_with_another_process_count_is_refused(tmp_path):
    """How a global batch is split across ranks, and their random draws, depend on the process count: a run
    started with one process resumes only with one."""
    out = tmp_path / "run"
    common = ["train", *TASKS["vision"], "--threads", "1", "--no-progress", "--out", str(out)]
    assert subprocess.run([sys.executable, "-m", "multihead.cli", *common], capture_output=True).returncode == 0
    proc = subprocess.run(
        [
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
            "--out",
            str(out),
            "--resume",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode != 0
    assert "trained with 1 process(es); resume it with the same count" in proc.stderr
