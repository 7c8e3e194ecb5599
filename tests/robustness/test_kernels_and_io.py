"""The attention entry point and the file layer under hostile input: flex with every mask shape and at lengths where
PyTorch's compiled CPU kernel is wrong (defect 5), float padding masks, empty sequences; atomic writes when the
rename fails, the swap and its recovery."""

from __future__ import annotations

import os

import pytest
import torch

import multihead as mh
from multihead import _io

flex = mh.list_backends()["flex"]
needs_flex = pytest.mark.skipif(flex.available() is not None, reason=f"flex unavailable: {flex.available()}")


def _formula(q, k, v, allowed):
    """softmax(q k^T / sqrt(d)) v in fp64 over allowed keys; rows with no allowed key are zero."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v


# ---------------------------------------------------------------------------------------------------- 5. flex
@needs_flex
@pytest.mark.parametrize("dims", [2, 3, 4])
def test_flex_takes_every_documented_mask_shape(dims):
    gen = torch.Generator().manual_seed(dims)
    q, k, v = (torch.randn(2, 2, 16, 8, generator=gen) for _ in range(3))
    m = torch.rand(2, 16, 16, generator=gen) > 0.3
    mask = {2: m[0], 3: m, 4: m[:, None]}[dims]  # (Lq, Lk); (H, Lq, Lk); (B, 1, Lq, Lk): broadcast from the right
    with torch.no_grad():
        out, _ = mh.attention(q, k, v, mask=mask, backend="flex")
    allowed = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(2, 2, 16, 16)
    assert (out.double() - _formula(q, k, v, allowed)).abs().max() < 1e-5


@needs_flex
def test_flex_causal_with_more_keys_than_queries():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 16, 8, generator=gen)
    k, v = (torch.randn(1, 2, 48, 8, generator=gen) for _ in range(2))
    with torch.no_grad():
        out, _ = mh.attention(q, k, v, is_causal=True, backend="flex")
    from multihead.attention.masks import causal_mask

    allowed = causal_mask(16, 48)[None, None].expand(1, 2, 16, 48)
    assert (out.double() - _formula(q, k, v, allowed)).abs().max() < 1e-5


@needs_flex
@pytest.mark.parametrize("length", [8, 24, 200, 16])
def test_flex_is_exact_or_declines_with_the_reason_at_odd_lengths(length):
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, 2, length, 16, generator=gen) for _ in range(3))
    expected = _formula(q, k, v, torch.ones(1, 2, length, length, dtype=torch.bool))
    with torch.no_grad():
        try:
            out, _ = mh.attention(q, k, v, backend="flex")
        except ValueError as exc:
            assert "declines this shape on CPU" in str(exc) and "sdpa" in str(exc)
            reason = dict(mh.explain(q, k))["flex"]
            assert reason and "declines this shape" in reason  # auto skips it from now on
            with pytest.raises(ValueError, match="declines this shape"):
                mh.attention(q, k, v, backend="flex")
            return
    assert (out.double() - expected).abs().max() < 1e-5  # never a silent wrong answer


# ---------------------------------------------------------------------------------------------------- masks, sizes
def test_float_key_padding_mask_is_refused_with_the_fix():
    mha = mh.MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    hf_style = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(TypeError, match=r"\.bool\(\)"):
        mha(x, key_padding_mask=hf_style)
    out, _ = mha(x, key_padding_mask=hf_style.bool())
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memory_efficient", "performer", "linear_elu"])
@pytest.mark.parametrize("lq, lk", [(0, 0), (0, 5), (5, 0)])
def test_empty_sequences_give_empty_or_zero_outputs(backend, lq, lk):
    q = torch.randn(1, 2, lq, 8, requires_grad=True)
    k = torch.randn(1, 2, lk, 8, requires_grad=True)
    out, _ = mh.attention(q, k, k, backend=backend)
    assert out.shape == (1, 2, lq, 8) and not out.abs().sum()
    out.sum().backward()
    assert q.grad is not None and not q.grad.abs().sum()


# ---------------------------------------------------------------------------------------------------- _io
def test_failed_rename_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    _io.atomic_write_json(path, {"v": 1})
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_io.os, "replace", broken)
    with pytest.raises(OSError):
        _io.atomic_write_json(path, {"v": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left behind


def test_every_library_writer_goes_through_io(tmp_path, monkeypatch):
    """With renames failing, writers of the run folder, pages and figures fail cleanly and keep old files."""
    from multihead.plotting import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    save(fig, tmp_path / "fig")
    before = (tmp_path / "fig.png").read_bytes()
    monkeypatch.setattr(_io.os, "replace", lambda *a, **k: (_ for _ in ()).throw(OSError(5, "I/O error")))
    fig, ax = plt.subplots()
    ax.plot([1, 0])
    with pytest.raises(OSError):
        save(fig, tmp_path / "fig")
    assert (tmp_path / "fig.png").read_bytes() == before


def test_publish_swaps_whole_folders_and_cleans_up_on_error(tmp_path):
    out = tmp_path / "show"
    with _io.Publish(out, "show") as folder:
        (folder / "attention.html").write_text("one")
    assert (out / "attention.html").read_text() == "one"
    with pytest.raises(RuntimeError):
        with _io.Publish(out, "show") as folder:
            (folder / "attention.html").write_text("two")
            raise RuntimeError("killed halfway")
    assert (out / "attention.html").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".show.lock", "show"]


def _folder_with(path, name: str):
    """A folder multihead made (its manifest lists it) holding one file ``name`` whose text is ``name``."""
    path.mkdir()
    (path / name).write_text(name)
    _io.write_manifest(path)
    return path


@pytest.mark.parametrize("exchange", [True, False])
def test_swap_and_recovery_without_renameat2(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(_io, "_renameat2_exchange", lambda a, b: False)
    out = _folder_with(tmp_path / "run", "old")
    staged = _folder_with(tmp_path / ".run.new", "new")
    _io.swap_in(staged, out)
    assert sorted(p.name for p in out.iterdir()) == [_io.MANIFEST, "new"] and not staged.exists()
    # a writer killed between the two renames of the fallback: out is gone, .run.old holds it
    os.rename(out, tmp_path / ".run.old")
    _io.recover(out)
    assert sorted(p.name for p in out.iterdir()) == [_io.MANIFEST, "new"]


def test_lock_is_exclusive_across_processes_and_reentrant_within_one(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    with _io.folder_lock(out):
        with _io.folder_lock(out):  # re-entrant
            pass
        code = (
            "import sys; from multihead import _io\n"
            "try:\n    _io.folder_lock(sys.argv[1]).__enter__()\nexcept _io.FolderError as e:\n"
            "    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
        assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert proc.returncode == 0  # released


@pytest.mark.parametrize(
    "setup, kind",
    [
        (lambda p: None, "missing"),
        (lambda p: p.mkdir(), "empty"),
        (lambda p: p.write_text("x"), "file"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text('{"train": {}}')), "run"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "bert"}')), "hf"),
        (lambda p: (p.mkdir(), (p / "attention.html").write_text("")), "show"),
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("")), "other"),
    ],
)
def test_folder_kinds(tmp_path, setup, kind):
    p = tmp_path / "x"
    setup(p)
    assert _io.folder_kind(p) == kind


@needs_flex
def test_flex_sees_in_place_edits_of_a_reused_mask_buffer():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=gen) for _ in range(3))
    mask = torch.ones(1, 1, 128, 128, dtype=torch.bool)
    with torch.no_grad():
        mh.attention(q, k, v, mask=mask, backend="flex")
        mask[..., 64:] = False  # the same buffer, edited in place
        out, _ = mh.attention(q, k, v, mask=mask, backend="flex")
    assert (out.double() - _formula(q, k, v, mask.expand(1, 2, 128, 128))).abs().max() < 1e-5


def test_any_writer_taking_the_lock_cleans_a_killed_swap(tmp_path):
    """Killed after the exchange but before removing the old folder: the next lock holder (a resume too) removes it."""
    out = _folder_with(tmp_path / "run", "new")
    leftover = _folder_with(tmp_path / ".run.new", "old")
    with _io.folder_lock(out):
        pass
    assert not leftover.exists() and (out / "new").read_text() == "new"


def test_a_run_being_trained_is_in_progress_not_stopped(tmp_path):
    import subprocess
    import sys
    import time

    from multihead._weights import CheckpointError, load_tensors

    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "state.json").write_text("{}")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom multihead._io import folder_lock\n"
            f"with folder_lock({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=rf"in progress \(locked by pid {holder.pid}\)"):
            load_tensors(run / "model.safetensors")
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    with pytest.raises(CheckpointError, match="stopped before its first evaluation"):  # nobody writes it now
        load_tensors(run / "model.safetensors")
