"""Out of memory is said as such (exit 2, with the limit the process runs under), never an internal error; a path
that does not exist, or a folder with no config.json, is named for what it is."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from multihead.cli import main


def test_a_failed_allocation_is_out_of_memory_not_a_bug(monkeypatch, capsys):
    import multihead.cli.tools as tools

    def allocate(args):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: you tried "
            "to allocate 99999999999 bytes."
        )

    monkeypatch.setattr(tools, "cmd_backends", allocate)  # the parser is built per call: it takes this handler
    assert main(["backends"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory") and "internal error" not in err


def test_a_real_model_under_an_address_space_cap(tmp_path):
    """minilm under an 8 GB address-space cap: it fits (exit 0) or says it is out of memory and names the cap."""
    cap = 8 * 10**9

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(
        [sys.executable, "-m", "multihead", "show", "minilm", "The cat sat.", "--out", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert "out of memory" in proc.stderr and "ulimit -v" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("verb", [["generate"], ["heads"]])
def test_a_path_that_does_not_exist_is_said_to_not_exist(tmp_path, capsys, verb):
    assert main([*verb, str(tmp_path / "nonexistent") + "/", *(["hi"] if verb == ["generate"] else [])]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "pretraining run folder" not in err.split("does not exist")[0]


def test_a_folder_without_config_json_is_not_called_a_damaged_run(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"\0" * 16)
    assert main(["generate", str(tmp_path / "model"), "hi"]) == 2
    err = capsys.readouterr().err
    assert "not an HF model folder (no config.json)" in err
