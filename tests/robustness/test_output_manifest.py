"""Which files of an output folder are multihead's is read from the manifest it writes (each file it made, with its
hash), never guessed from suffixes or hidden names: a user's `.git/`, JSON, PNG or HTML beside our output stops a
rerun; a sibling `.NAME.old` or `.NAME.new` the user made is never taken for an interrupted swap; `explain` keeps
an earlier page unless told --overwrite."""

from __future__ import annotations

import json

import pytest

from multihead._io import (
    MANIFEST,
    FolderError,
    Publish,
    atomic_write_json,
    check_target,
    folder_lock,
    foreign_files,
    read_manifest,
)
from multihead.cli import main


def _publish(out, kind="kv", text="{}"):
    with Publish(out, kind) as folder:
        atomic_write_json(folder / f"{kind}.json", {"v": text})
        (folder / "kv.png").write_bytes(b"\x89PNG fake")  # written by any means: the manifest lists every file
        (folder / "sub").mkdir()
        (folder / "sub" / "page.html").write_text("<p>ours</p>")
    return out


def test_a_published_folder_lists_every_file_with_its_hash(tmp_path):
    out = _publish(tmp_path / "kvmine")
    listed = read_manifest(out)
    assert sorted(listed) == ["kv.json", "kv.png", "sub/page.html"]
    assert listed["kv.png"]["bytes"] == len(b"\x89PNG fake") and len(listed["kv.png"]["sha256"]) == 64
    assert foreign_files(out, "kv") == []
    _publish(out, text="again")  # our own output is replaced
    assert json.loads((out / "kv.json").read_text()) == {"v": "again"}


@pytest.mark.parametrize(
    "name", [".git/HEAD", "my_analysis.json", "thesis_figure.png", "report.html", ".notes", "sub/mine.svg"]
)
def test_files_the_user_added_are_never_taken_for_ours(tmp_path, name):
    out = _publish(tmp_path / "kvmine")
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_text("the user's")
    assert foreign_files(out, "kv") == [name.split("/")[0] + ("/" if "/" in name else "")]
    with pytest.raises(FolderError, match="multihead did not write"):
        check_target(out, "kv")
    with pytest.raises(FolderError, match="multihead did not write"):
        _publish(out)
    assert (out / name).read_text() == "the user's"


def test_a_file_of_ours_the_user_edited_is_theirs_now(tmp_path):
    out = _publish(tmp_path / "kvmine")
    (out / "kv.json").write_text('{"my": "edits"}')
    assert foreign_files(out, "kv") == ["kv.json"]


def test_a_folder_without_a_manifest_is_not_ours(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "kv.json").write_text("{}")  # looks like our output, but nothing says multihead wrote it
    with pytest.raises(FolderError, match="kv.json, which multihead did not write"):
        check_target(out, "kv")


def test_writes_in_place_under_the_lock_are_listed(tmp_path):
    out = tmp_path / "importance"
    with folder_lock(out):
        atomic_write_json(out / "importance-grad.json", {})
    with folder_lock(out):
        atomic_write_json(out / "importance-ablation.json", {})
    assert sorted(read_manifest(out)) == ["importance-ablation.json", "importance-grad.json"]
    assert foreign_files(out, "importance") == []


def test_a_sibling_old_folder_the_user_made_is_left_alone(tmp_path):
    out = _publish(tmp_path / "res")
    theirs = tmp_path / ".res.old"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("chapter 1")
    _publish(out, text="again")
    assert (theirs / "thesis.tex").read_text() == "chapter 1"
    # with the output gone, the user's .res.old is not "restored" in its place either
    import shutil

    shutil.rmtree(out)
    _publish(out, text="third")
    assert (theirs / "thesis.tex").read_text() == "chapter 1" and json.loads((out / "kv.json").read_text())


def test_an_interrupted_swap_of_ours_is_still_recovered(tmp_path):
    out = _publish(tmp_path / "res")
    backup = tmp_path / ".res.old"
    out.rename(backup)  # killed between the two renames of a two-step swap: only our backup is left
    assert (backup / MANIFEST).is_file()
    with folder_lock(out):
        pass
    assert json.loads((out / "kv.json").read_text()) == {"v": "{}"} and not backup.exists()


def test_a_sibling_new_folder_the_user_made_is_refused_not_deleted(tmp_path):
    theirs = tmp_path / ".res.new"
    theirs.mkdir()
    (theirs / "draft.md").write_text("mine")
    with pytest.raises(FolderError, match="is in the way"):
        _publish(tmp_path / "res")
    assert (theirs / "draft.md").read_text() == "mine"


def test_explain_keeps_an_earlier_page_unless_told(tmp_path, capsys):
    out = tmp_path / "explain"
    assert main(["explain", "The cat sat on the mat.", "--out", str(out)]) == 0
    page = (out / "explain.html").read_bytes()
    capsys.readouterr()
    assert main(["explain", "A dog ran.", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "explain.html").read_bytes() == page
    assert main(["explain", "A dog ran.", "--out", str(out), "--overwrite"]) == 0
    assert (out / "explain.html").read_bytes() != page


def test_a_writer_killed_while_removing_the_old_folder_is_undone_by_the_next(tmp_path, monkeypatch):
    """Killed after the exchange, before (or while) the old folder was removed: what is left still says it is ours
    (the manifest and staging marker go last), so the next writer removes it -- an old folder written before
    manifests existed too (it is marked before it is swapped out)."""
    import multihead._io as io

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"train": {}}')  # an older multihead's run: no manifest
    staged = tmp_path / ".run.new"
    staged.mkdir()
    (staged / "config.json").write_text('{"train": {"new": true}}')
    io.write_manifest(staged)
    with monkeypatch.context() as m:
        m.setattr(io, "_remove_ours", lambda folder: None)  # the kill: nothing removed after the exchange
        io.swap_in(staged, out)
    assert staged.is_dir() and io.is_ours(staged)
    with folder_lock(out):  # the next writer (a resume too) cleans it
        pass
    assert not staged.exists() and json.loads((out / "config.json").read_text()) == {"train": {"new": True}}
    # half removed: the manifest is still there, so it is still ours
    half = tmp_path / ".run.new"
    half.mkdir()
    (half / "leftover.bin").write_bytes(b"x")
    io.write_manifest(half)
    (half / "leftover.bin").unlink()
    (half / "other").write_text("left by the kill")
    with folder_lock(out):
        pass
    assert not half.exists()


def test_a_commit_that_fails_leaves_no_half_built_folder(tmp_path, monkeypatch):
    """The disk fills while the manifest is written at the end of the block: the old output stays, the staged folder
    goes (it was left behind before, and the next run refused it as a folder in the way)."""
    import errno

    from multihead import _io

    out = _publish(tmp_path / "out", text="old")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_io, "write_manifest", full)
    with pytest.raises(OSError, match="No space"):
        with Publish(out, "kv", overwrite=True) as folder:
            atomic_write_json(folder / "kv.json", {"v": "new"})
    assert json.loads((out / "kv.json").read_text()) == {"v": "old"}
    assert not list(tmp_path.glob(".out.new*"))
    monkeypatch.undo()
    _publish(out, text="again")  # the next run is not refused by a folder left in the way
    assert json.loads((out / "kv.json").read_text()) == {"v": "again"}


# ---------------------------------------------------------------------------------------------------- hostile folders
def test_a_lock_file_that_is_a_symlink_is_never_written_through(tmp_path):
    """A lock file linked to a file outside the output folder: the file outside is neither truncated nor written,
    and the writer is refused with the fix (with and without --overwrite: the lock comes first)."""
    import os

    outside = tmp_path / "elsewhere.txt"
    outside.write_text("precious")
    (tmp_path / ".out.lock").symlink_to(outside)
    for overwrite in (False, True):
        with pytest.raises(FolderError, match="symbolic link.*Remove it"):
            with Publish(tmp_path / "out", "kv", overwrite=overwrite) as folder:
                atomic_write_json(folder / "kv.json", {})
    assert outside.read_text() == "precious" and not (tmp_path / "out").exists()
    # a dangling link is refused too (O_CREAT would otherwise create its target)
    os.unlink(tmp_path / ".out.lock")
    (tmp_path / ".out.lock").symlink_to(tmp_path / "made-by-the-link")
    with pytest.raises(FolderError, match="symbolic link"):
        with folder_lock(tmp_path / "out"):
            pass
    assert not (tmp_path / "made-by-the-link").exists()


@pytest.mark.parametrize("what", ["hardlink", "content", "fifo"])
def test_a_lock_file_that_is_not_a_small_pid_file_is_refused_untouched(tmp_path, what):
    import os

    lock = tmp_path / ".out.lock"
    if what == "hardlink":
        (tmp_path / "mine.txt").write_text("12")
        os.link(tmp_path / "mine.txt", lock)
    elif what == "content":
        lock.write_text("my notes, not a pid")
    else:
        os.mkfifo(lock)
    with pytest.raises(FolderError, match="not a lock file multihead made"):
        with folder_lock(tmp_path / "out"):
            pass
    if what == "hardlink":
        assert (tmp_path / "mine.txt").read_text() == "12"
    if what == "content":
        assert lock.read_text() == "my notes, not a pid"


def test_a_lock_file_multihead_left_is_reused(tmp_path):
    out = _publish(tmp_path / "kvmine")
    assert (tmp_path / ".kvmine.lock").read_text().strip().isdigit()
    _publish(out, text="again")
    assert json.loads((out / "kv.json").read_text()) == {"v": "again"}


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_forged_manifest_listing_a_users_file_does_not_make_it_ours(tmp_path, overwrite):
    """A manifest that lists the user's file with its real hash (forged, or copied from another output) proves
    nothing: it was not written for this folder, so the user's file is never deleted."""
    import hashlib

    out = tmp_path / "out"
    out.mkdir()
    notes = out / "notes.txt"
    notes.write_text("the user's notes")
    (out / "kv.json").write_text("{}")
    digest = hashlib.sha256(notes.read_bytes()).hexdigest()
    forged = {"sha256": digest, "bytes": notes.stat().st_size}
    (out / MANIFEST).write_text(json.dumps({"writer": "multihead", "files": {"notes.txt": forged, "kv.json": {}}}))
    with pytest.raises(FolderError, match="manifest written for another folder"):
        _publish(out) if not overwrite else check_target(out, "kv", overwrite=True)
    assert notes.read_text() == "the user's notes"


def test_a_manifest_copied_with_its_folder_is_not_ours_and_a_moved_one_still_is(tmp_path):
    import shutil

    out = _publish(tmp_path / "kvmine")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # same names, same hashes, but another folder
    (copy / "notes.txt").write_text("the user's")
    assert foreign_files(copy, "kv") == ["kv.json", "kv.png", "notes.txt", "sub/"]
    with pytest.raises(FolderError, match="another folder"):
        _publish(copy)
    assert (copy / "notes.txt").read_text() == "the user's"
    moved = tmp_path / "moved"
    out.rename(moved)  # a rename keeps the folder's identity: still our output
    assert foreign_files(moved, "kv") == []


def test_a_users_file_with_the_same_bytes_as_ours_is_not_ours(tmp_path):
    """The user replaces our file with another file of the same bytes (a restored backup): its inode differs."""
    out = _publish(tmp_path / "kvmine")
    data = (out / "kv.json").read_bytes()
    (out / "kv.json").unlink()
    (out / "kv.json").write_bytes(data)
    assert foreign_files(out, "kv") == ["kv.json"]


def test_a_nested_output_saved_inside_is_the_users_result(tmp_path):
    """``out/kvsub`` holds another multihead output with its own manifest, saved there by the user: rerunning the
    writer of ``out`` does not delete it."""
    out = _publish(tmp_path / "out")
    inner = _publish(tmp_path / "kvsub", text="the user's earlier result")
    inner.rename(out / "kvsub")
    assert foreign_files(out, "kv") == ["kvsub/"]
    with pytest.raises(FolderError, match="kvsub/, which multihead did not write"):
        _publish(out, text="again")
    with pytest.raises(FolderError, match="kvsub/, which multihead did not write"):
        check_target(out, "kv", overwrite=True)
    assert json.loads((out / "kvsub" / "kv.json").read_text()) == {"v": "the user's earlier result"}


def test_an_output_published_inside_a_locked_folder_is_the_writers(tmp_path):
    """The tour writes outputs into sub-folders of its folder, under its lock: those are its own on a rerun."""
    out = tmp_path / "tour"
    for text in ("first", "second"):
        with folder_lock(out):
            atomic_write_json(out / "demo.json", {})
            _publish(out / "part", text=text)
        assert foreign_files(out, "demo") == []
    assert json.loads((out / "part" / "kv.json").read_text()) == {"v": "second"}


def test_a_backup_folder_holding_the_users_notes_is_not_removed(tmp_path):
    """``.out.old`` holds a multihead manifest and the user's own notes: the notes stay."""
    out = _publish(tmp_path / "res")
    backup = _publish(tmp_path / "elsewhere")
    backup.rename(tmp_path / ".res.old")  # a backup of ours (manifest bound to it) ...
    (tmp_path / ".res.old" / "mynotes.txt").write_text("mine")  # ... where the user kept notes
    _publish(out, text="again")
    assert (tmp_path / ".res.old" / "mynotes.txt").read_text() == "mine"
    assert json.loads((out / "kv.json").read_text()) == {"v": "again"}


def test_a_runs_file_names_count_only_at_its_top(tmp_path):
    """A run's own files are known by name (model.safetensors, config.json, ...) in the run folder itself; the same
    names inside a sub-folder the user made there are the user's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"train": {}}')
    (run / "mine").mkdir()
    (run / "mine" / "model.safetensors").write_bytes(b"the user's model")
    assert foreign_files(run, "run") == ["mine/"]
    with pytest.raises(FolderError, match="mine/, which multihead did not write"):
        check_target(run, "run", overwrite=True)
