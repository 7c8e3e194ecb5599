"""Fixtures of the hostile-input suite (helpers in robust_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from robust_helpers import run_cli, tiny_train_args


@pytest.fixture(scope="session")
def data_csv(sentiment_csv) -> Path:
    return Path(sentiment_csv)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_csv) -> Path:
    """A small finished run folder (2 layers x 2 heads), made once; tests copy it before changing anything."""
    out = tmp_path_factory.mktemp("robust-run") / "run"
    proc = run_cli(*tiny_train_args(data_csv, out), subprocess_=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def run_copy(tmp_path, trained_run) -> Path:
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(trained_run, dst)
    return dst
