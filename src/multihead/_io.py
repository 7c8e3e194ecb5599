"""Writing files and folders so that nothing is lost: the ground floor every writer in multihead stands on.

* **Atomic files** -- :func:`atomic_write_bytes` / :func:`atomic_write_json`: a temp file in the same folder,
  fsync, then one ``os.replace``; a reader sees the old file or the new one, never half of one.
* **Locked folders** -- :func:`folder_lock`: an exclusive ``flock`` on a sibling ``.NAME.lock`` file, held while a
  folder is written (train, resume, prune, export, show, ...). A second writer is refused at once with the holder's
  pid. The lock dies with its process, so a killed writer never leaves a stale lock.
* **Folder transactions** -- :class:`Publish`: a new folder is built in a sibling ``.NAME.new`` and swapped in by
  one rename when complete (``renameat2(RENAME_EXCHANGE)`` on Linux: the old and the new folder trade places
  atomically). Until then the old folder is untouched; killed at any point, the target holds the old folder or the
  new one, never a mix. Leftovers of a killed writer are cleaned (or the old folder restored) by the next writer.
* **Kinds** -- :func:`folder_kind` recognises what a folder holds (a run, an HF export, a ``show`` page, ...); a
  writer refuses a non-empty target of another kind unless told ``overwrite``, and never writes into a run folder
  it reads from.
* **Manifests** -- every published folder holds ``.multihead-manifest.json``: each file multihead wrote there, with
  its sha256 (writers that add files in place under the folder's lock add them when the lock is released). What a
  later writer may replace is read from it (:func:`foreign_files`): a file it does not list unchanged is the user's.

::

    parent/
      NAME/          the published folder (old, until the swap), with its .multihead-manifest.json
      .NAME.new/     the folder being built (the writer's own: .multihead-staging inside)
      .NAME.lock     flock'ed by the writer; holds its pid
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path


class FolderError(RuntimeError):
    """A folder that cannot be written (busy, of another kind, a file, unwritable); the message says what to do."""


# ---------------------------------------------------------------------------------------------------- reading JSON
MAX_JSON_BYTES = 4 << 20  # configs, indexes and tokenizer configs are kilobytes
MAX_JSON_DEPTH = 64  # HF configs nest a handful of levels (a vision config inside a multimodal one)


class JSONFileError(ValueError):
    """A JSON file that is missing, too large, not UTF-8, not JSON, or nested deeper than any config."""


def read_json_file(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The JSON value in ``path``, its size checked before it is read and its nesting after (every config, index
    and tokenizer config multihead reads from a folder it was handed goes through here)."""
    import stat

    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a device (/dev/zero), a FIFO or a socket reports no size: never read it
            raise JSONFileError(f"{path} is not a regular file (a device, pipe or socket); it cannot be a config")
        if st.st_size > max_bytes:
            raise JSONFileError(
                f"{path} is {st.st_size:,} bytes; such a file is a few kilobytes (at most {max_bytes:,} are read)"
            )
        with open(path, "rb") as f:  # bounded by the bytes actually read, whatever the size said
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise JSONFileError(f"{path} holds more than {max_bytes:,} bytes; such a file is a few kilobytes")
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JSONFileError(f"{path} is not UTF-8 text") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONFileError(f"{path} nests deeper than {max_depth} levels, deeper than any config") from None
    except json.JSONDecodeError as exc:
        raise JSONFileError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise JSONFileError(f"{path} nests deeper than {max_depth} levels, deeper than any config")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value


# ---------------------------------------------------------------------------------------------------- files
_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file + fsync + rename: the old file stays until the new is whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; keep the mode a plain open() would give
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        folder_lock.wrote(path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not exc.filename:  # a full disk says so without naming the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj, *, indent: int | None = 2) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=indent) + "\n").encode("utf-8"))


def atomic_save_figure(fig, path: str | Path, **kwargs) -> Path:
    """``fig.savefig`` through a temp file in the same folder (matplotlib writes in several steps)."""
    import io

    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or "png", **kwargs)
    atomic_write_bytes(path, buf.getvalue())
    return path


# ---------------------------------------------------------------------------------------------------- kinds
RUN_SECTIONS = ("train", "g2p", "pretrain", "vision", "grounding")  # config.json sections of the tasks' run folders
# What the tasks write into a run folder (besides figures, *.png/*.svg, and folders of our other outputs): an
# --overwrite that would delete anything else is refused.
RUN_FILES = {
    "config.json",
    "metrics.jsonl",
    "model.safetensors",
    "results.json",
    "splits.json",
    "tokenizer.json",
    "vocab.json",
    "labels.json",
    "inputs.json",
    "checkpoint",
    "encoder",
}
OUR_KINDS = (
    "run",
    "hf",
    "show",
    "heads",
    "importance",
    "sweep",
    "induction",
    "sinks",
    "compare",
    "demo",
    "circuit",
    "kv",
)


def folder_kind(path: str | Path) -> str:
    """``missing``, ``file``, ``empty``, ``run`` (a training run), ``hf`` (an HF model folder), ``show``,
    ``heads``, ``importance``, ``sweep``, ``induction``, ``sinks``, ``compare``, ``demo``, ``circuit``, ``kv``, or
    ``other``."""
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "file"
    names = {p.name for p in path.iterdir()}
    if not names:
        return "empty"
    if "config.json" in names:
        try:
            cfg = read_json_file(path / "config.json")
        except (OSError, ValueError):
            return "other"
        if isinstance(cfg, dict) and any(section in cfg for section in RUN_SECTIONS):
            return "run"
        if isinstance(cfg, dict) and "model_type" in cfg:
            return "hf"
        return "other"
    for kind, marker in (
        ("show", "attention.html"),
        ("show", "cross.html"),
        ("show", "image.json"),
        ("show", "explain.html"),
        ("heads", "heads.json"),
        ("heads", "kv-heads.json"),
        ("kv", "kv.json"),
        ("sweep", "sweep.json"),
        ("induction", "induction.json"),
        ("sinks", "sinks.json"),
        ("compare", "compare.json"),
        ("demo", "demo.json"),
        ("circuit", "circuit.json"),
        ("demo", "pretrained.json"),
        ("demo", "smollm2.json"),
        ("demo", "media.json"),
    ):
        if marker in names:
            return kind
    if any(n.startswith("importance-") and n.endswith(".json") for n in names):
        return "importance"
    return "other"


MANIFEST = ".multihead-manifest.json"  # in every output folder: the files multihead wrote there, with their hashes
STAGING = ".multihead-staging"  # in a folder being built (.NAME.new) until it is published


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path):
    """Every regular file under ``folder`` (relative POSIX paths), the manifest and staging marker left out."""
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for n in sorted(names):
            rel = Path(root, n).relative_to(folder).as_posix()
            if rel not in (MANIFEST, STAGING):
                yield rel


def _identity(path: Path) -> dict[str, int]:
    """What binds a manifest to its folder: the folder's device and inode. A rename (the publishing swap, or the
    user moving the folder) keeps them; a copy, an archive unpacked elsewhere or a forged file does not."""
    st = os.stat(path, follow_symlinks=False)
    return {"dev": st.st_dev, "ino": st.st_ino}


def _manifest(folder: str | Path) -> dict[str, dict] | None:
    """The files a manifest in ``folder`` lists, or None when there is none, it is not multihead's, or it was not
    written for this very folder (copied or forged: its recorded folder identity differs)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file() or path.is_symlink() or folder.is_symlink():
        return None
    try:
        data = read_json_file(path, max_bytes=64 << 20)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("writer") != "multihead":
        return None
    try:
        if data.get("folder") != _identity(folder):
            return None
    except OSError:
        return None
    files = data.get("files")
    return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else None


def foreign_manifest(folder: str | Path) -> bool:
    """Whether ``folder`` holds a multihead manifest that was written for another folder (a copy of an output, or a
    forged file): such a folder is never taken for multihead's own."""
    path = Path(folder) / MANIFEST
    return path.is_file() and _manifest(folder) is None


def read_manifest(folder: str | Path) -> dict[str, dict]:
    """``{relative path: {"sha256", "bytes", "ino", "mtime_ns"}}`` of the files multihead wrote into ``folder``
    ({} where it has no manifest, one that is not ours, or one written for another folder)."""
    return _manifest(folder) or {}


def _entry(f: Path) -> dict:
    st = f.stat()
    return {"sha256": _sha256(f), "bytes": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}


def write_manifest(folder: str | Path, paths=None) -> None:
    """Record in ``folder``'s manifest the files multihead wrote there: every file under it (``paths`` None, when a
    folder is published whole), or ``paths`` (relative) added to what it lists (writers that add files in place).
    Each entry holds the file's hash, size, inode and modification time, and the manifest holds the folder's own
    identity: a copy of the manifest, or of the folder, proves nothing. Entries whose file is gone are dropped."""
    folder = Path(folder)
    listed = {} if paths is None else read_manifest(folder)
    for rel in _files(folder) if paths is None else paths:
        f = folder / rel
        if f.is_file() and not f.is_symlink():
            listed[rel] = _entry(f)
    listed = {k: v for k, v in sorted(listed.items()) if (folder / k).is_file()}
    body = {"writer": "multihead", "folder": _identity(folder), "files": listed}
    atomic_write_bytes(folder / MANIFEST, (json.dumps(body, indent=1) + "\n").encode())


def _mark_staging(folder: Path) -> None:
    """Mark ``folder`` as one multihead is building (or swapping out): the marker names the folder's identity."""
    (folder / STAGING).write_text(json.dumps(_identity(folder)))


def _staging(folder: Path) -> bool:
    """Whether ``folder`` holds a staging marker multihead wrote for this very folder."""
    marker = folder / STAGING
    if not marker.is_file() or marker.is_symlink() or marker.stat().st_size > 256:
        return False
    try:
        return json.loads(marker.read_text()) == _identity(folder)
    except (OSError, ValueError):
        return False


def is_ours(folder: str | Path) -> bool:
    """Whether multihead made ``folder`` (it holds multihead's manifest or staging marker, written for this
    folder)."""
    folder = Path(folder)
    return folder.is_dir() and not folder.is_symlink() and (_staging(folder) or _manifest(folder) is not None)


def _lock_file(p: Path) -> bool:
    """A lock file a writer of a sub-folder left (``.NAME.lock`` holding a pid)."""
    if not (p.name.startswith(".") and p.name.endswith(".lock") and p.is_file() and p.stat().st_size < 64):
        return False
    return p.read_bytes().strip().isdigit() or p.stat().st_size == 0


def foreign_files(folder: Path, kind: str = "run") -> list[str]:
    """What a folder of ``kind`` holds that multihead did not write there (sorted names): replacing the folder
    would delete them. Every output folder lists what multihead wrote in its manifest (:data:`MANIFEST`, with each
    file's hash, inode and time, bound to the folder), and a file is ours only if that manifest lists it unchanged
    -- a user's file, hidden or not and whatever its suffix, never is. Another output nested inside (a sub-folder
    with a manifest of its own) counts only where the outer manifest lists that manifest: the user's earlier
    result saved there is theirs. A run's own files are also known by name (:data:`RUN_FILES`, figures)."""
    folder = Path(folder)
    scopes = [(folder, read_manifest(folder), kind)]
    return [p.name + ("/" if p.is_dir() else "") for p in sorted(folder.iterdir()) if not _ours(p, scopes)]


def _ours(p: Path, scopes: list[tuple[Path, dict, str]]) -> bool:
    """Whether ``p`` (and everything under it) is multihead's, by the manifests of the folders around it
    (``scopes``, outermost first): each inner scope is a nested output that an outer manifest vouches for."""
    root, _, kind = scopes[-1]
    here = p.parent == root
    if (here and p.name in (MANIFEST, STAGING)) or _lock_file(p):  # a sub-folder writer's lock: a pid, nothing else
        return True
    if here and kind == "run" and (p.name in RUN_FILES or p.name.startswith(".") or p.suffix in (".png", ".svg")):
        return True
    if p.is_dir() and not p.is_symlink():
        inner = scopes
        nested = read_manifest(p)
        if nested and any(_unchanged(r, (p / MANIFEST).relative_to(r).as_posix(), listed) for r, listed, _ in scopes):
            inner = [*scopes, (p, nested, folder_kind(p))]
        return all(_ours(c, inner) for c in p.iterdir())
    return any(_unchanged(r, p.relative_to(r).as_posix(), listed) for r, listed, _ in scopes)


def _unchanged(folder: Path, rel: str, listed: dict) -> bool:
    entry = listed.get(rel)
    f = folder / rel
    if entry is None or f.is_symlink() or not f.is_file():
        return False
    st = f.stat()
    return (
        st.st_size == entry.get("bytes")
        and st.st_ino == entry.get("ino")
        and st.st_mtime_ns == entry.get("mtime_ns")
        and _sha256(f) == entry.get("sha256")
    )


_WHAT = {
    "run": "a training run",
    "hf": "an HF model folder",
    "other": "other files (not written by multihead)",
    "circuit": "a circuit's results",
    "show": "attention pages",
    "importance": "head importance results",
    "kv": "KV policy curves",
}


def check_target(
    out: str | Path, kind: str, *, overwrite: bool = False, sources: tuple = (), replace_own: bool = True
) -> Path:
    """Refuse to write a ``kind`` folder at ``out`` when that would lose something -- before any work is done: ``out``
    is a file; it is, or holds, one of the inputs being read (``sources``); it is a non-empty folder of another kind
    (or of the same kind, for runs and exports) without ``overwrite``. Replacing an existing folder (with
    ``overwrite``, or an analysis output of the same kind without it) replaces our own output of that kind and
    nothing else: never files multihead did not write (:func:`foreign_files`: a folder holding any is refused,
    naming them), another kind of output, or the current directory or one of its parents. Also checks the parent is
    writable."""
    out = Path(out)
    target = out.resolve()
    for src in sources:
        if src is None or not Path(src).exists():
            continue
        read = Path(src).resolve()
        if target == read:
            raise FolderError(
                f"--out {str(out)!r} is the folder being read; write to another folder (the source is never modified)"
            )
        if target in read.parents:
            raise FolderError(
                f"--out {str(out)!r} holds {str(src)!r}, which this command reads; write to another "
                "folder (inputs are never modified)"
            )
    found = folder_kind(out)
    if found == "file":
        raise FolderError(f"--out {str(out)!r} is a file, not a folder; choose a folder path")
    replaceable = found in ("missing", "empty") or (found == kind and kind not in ("run", "hf") and replace_own)
    if not replaceable and not overwrite:
        what = _WHAT.get(found, f"{found} output")
        fix = (
            "choose another folder (--overwrite replaces only multihead's own output)"
            if found == "other"
            else "pass --overwrite to replace it, or choose another folder"
        )
        what = f"an earlier {what}" if found == kind else what
        raise FolderError(f"--out {str(out)!r} already holds {what}; {fix}")
    if found not in ("missing", "empty"):  # an existing folder is replaced: our own output of this kind only
        cwd = Path.cwd().resolve()
        if target == cwd or target in cwd.parents:
            raise FolderError(
                f"--out {str(out)!r} is the current directory or holds it; replacing it would delete "
                "everything in it: write to a folder of its own"
            )
        if found != kind:
            raise FolderError(
                f"--out {str(out)!r} holds {_WHAT.get(found, f'{found} output')}, not "
                f"{_WHAT.get(kind, f'{kind} output')}; --overwrite replaces only that: choose another "
                "folder (or remove it yourself)"
            )
        strangers = foreign_files(out, kind)
        if strangers and foreign_manifest(out):
            raise FolderError(
                f"--out {str(out)!r} holds a multihead manifest written for another folder (a copy, or a file "
                "placed there), so nothing in it is taken for multihead's own output; replacing it could delete "
                "your files: choose another folder (or remove it yourself)"
            )
        if strangers:
            raise FolderError(
                f"--out {str(out)!r} holds {_WHAT.get(kind, f'{kind} output')} and also "
                f"{', '.join(strangers[:5])}{' ...' if len(strangers) > 5 else ''}, which multihead did not write; "
                "replacing the folder would delete them: move them out, or choose another folder"
            )
    parent = out.resolve().parent
    probe = parent
    while not probe.exists():  # the nearest existing ancestor must let us create the folder
        probe = probe.parent
    if not probe.is_dir():
        raise FolderError(f"cannot create {str(out)!r}: {str(probe)!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise FolderError(f"cannot write {str(out)!r}: no write permission in {str(probe)!r}")
    return out


# ---------------------------------------------------------------------------------------------------- locks
def _sibling(out: Path, suffix: str) -> Path:
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name}.{suffix}"


def _open_lock(path: Path, flags: int) -> int:
    """Open (or create) the lock file ``path`` without ever following a link: a lock file is a small regular file
    holding a pid, with one name. A symlink, a hard link to another file, a device, a FIFO or a file holding
    anything else is refused, never truncated or written through."""
    import stat

    what = None
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            what = "a symbolic link"
        elif exc.errno in (errno.EISDIR, errno.ENXIO):
            what = "a folder" if exc.errno == errno.EISDIR else "a socket or device"
        else:
            raise
    else:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "not a regular file (a FIFO, device or socket)"
        elif st.st_nlink != 1:
            what = f"a hard link ({st.st_nlink} names for one file)"
        elif st.st_size > 64 or not (os.pread(fd, 64, 0).strip().isdigit() or st.st_size == 0):
            what = "a file holding something other than a pid"
        if what is not None:
            os.close(fd)
    if what is not None:
        raise FolderError(
            f"{str(path)!r} is {what}, not a lock file multihead made; multihead never writes through it. "
            "Remove it (or rename it), then retry"
        )
    return fd


def _acquire(path: Path, target: str) -> int:
    """An exclusive ``flock`` on the lock file ``path`` (made if missing, never through a link), holding this
    process's pid; refused at once, naming the holder, when another process holds it (``target``: what it guards)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise FolderError(
                f"{target!r} is being written by another multihead process (pid {holder}); wait "
                "for it to finish, or stop it, then retry"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class file_lock:
    """Exclusive lock on writing the file ``out`` (a benchmark's JSON, which a resumed run rewrites after every
    sample): ``with file_lock(out): ...``. The lock file lies in the user's cache folder (the system's temporary
    folder where that cannot be written), named by ``out``'s absolute path, so that nothing is written beside ``out``
    (a refused run leaves its folder as it was). Refuses at once, naming the holder's pid."""

    def __init__(self, out: str | Path):
        import hashlib

        self.out = Path(os.path.abspath(out))
        self.name = hashlib.sha256(str(self.out).encode()).hexdigest()[:32] + ".lock"
        self.fd: int | None = None

    def __enter__(self) -> file_lock:
        try:
            self.fd = _acquire(cache_home() / "locks" / self.name, str(self.out))
        except (PermissionError, NotADirectoryError, FileExistsError):  # no cache folder to write: the temporary one
            self.fd = _acquire(
                Path(tempfile.gettempdir()) / f"multihead-locks-{os.getuid()}" / self.name, str(self.out)
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


class folder_lock:
    """Exclusive lock on writing folder ``out`` (``with folder_lock(out): ...``). Refuses at once, naming the
    holder's pid, when another process holds it. Re-entrant within one process. On acquiring it, what a killed
    writer left is cleaned up (:func:`recover`)."""

    _held: dict[str, int] = {}
    _written: dict[str, set[str]] = {}  # lock path -> files written in place under its folder while held

    @classmethod
    def wrote(cls, path: str | Path) -> None:
        """Note a file written (atomically) into a folder this process holds locked: its manifest lists it when
        the lock is released."""
        path = Path(os.path.abspath(path))
        for key in cls._held:
            lock = Path(key)
            folder = lock.parent / lock.name[1 : -len(".lock")]
            if folder in path.parents and path != folder / MANIFEST:
                cls._written.setdefault(key, set()).add(path.relative_to(folder).as_posix())

    def __init__(self, out: str | Path):
        self.path = _sibling(Path(out), "lock")
        self.fd: int | None = None

    def __enter__(self) -> folder_lock:
        key = str(self.path)
        if key in self._held:
            self._held[key] += 1
            return self
        self.fd = _acquire(self.path, self.path.name[1 : -len(".lock")])
        self._held[key] = 1
        try:  # whoever takes the lock first cleans what a killed writer left (a resume too, not only a new build)
            recover(self.path.parent / self.path.name[1 : -len(".lock")])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        key = str(self.path)
        if key not in self._held:
            return
        self._held[key] -= 1
        if self._held[key] == 0:
            del self._held[key]
            written = self._written.pop(key, set())
            folder = self.path.parent / self.path.name[1 : -len(".lock")]
            try:
                if written and folder.is_dir() and not folder.is_symlink():
                    write_manifest(folder, sorted(written))
            finally:
                if self.fd is not None:
                    os.close(self.fd)  # closing releases the flock
                    self.fd = None
            return


def lock_holder(out: str | Path) -> str | None:
    """The pid of the process writing folder ``out`` (holding its lock), or None when nobody is."""
    path = _sibling(Path(out), "lock")
    if not path.is_file() or path.is_symlink() or str(path) in folder_lock._held:
        return None
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except FolderError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # closing releases a lock taken here
    return None


# ---------------------------------------------------------------------------------------------------- swaps
def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def recover(out: str | Path) -> None:
    """Undo what a killed writer of ``out`` left (call with the lock held): a half-built ``.NAME.new`` is removed;
    a ``.NAME.old`` from an interrupted two-step swap is put back when ``out`` is missing, else removed."""
    out = Path(os.path.abspath(out))
    new, old = _sibling(out, "new"), _sibling(out, "old")
    if old.exists() and is_ours(old):  # only a backup multihead made (its manifest says so) is ever moved
        if not out.exists():
            os.rename(old, out)  # put back: a rename loses nothing
        elif _staging(old) or not foreign_files(old, folder_kind(old)):
            _remove_ours(old)
        # else: it holds files multihead did not write (the user's notes beside a backup): they are not ours to
        # remove, and the folder stays where it is (a two-step swap refuses it as a folder in the way)
    if new.exists() or new.is_symlink():
        if not is_ours(new) and not (new.is_dir() and not new.is_symlink() and not any(new.iterdir())):
            raise FolderError(
                f"{str(new)!r} is in the way: multihead builds the new {out.name!r} there, and that folder is not "
                "one it made (no .multihead-staging inside); move or rename it, then retry"
            )
        _remove_ours(new)


def _remove_ours(folder: Path) -> None:
    """Remove a folder multihead made, its manifest and staging marker last: a writer killed halfway leaves a
    folder that still says it is multihead's, which the next writer then removes (and never a user's folder)."""
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink()
        return
    for child in folder.iterdir():
        if child.name in (MANIFEST, STAGING):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def swap_in(staged: Path, out: Path) -> None:
    """Publish folder ``staged`` at ``out`` in one step; the previous ``out`` (if any) is removed afterwards."""
    staged, out = Path(os.path.abspath(staged)), Path(os.path.abspath(out))
    if out.is_dir() and not out.is_symlink() and _manifest(out) is None:  # once swapped out it must say it is ours,
        _mark_staging(out)  # so that a writer killed before removing it is undone by the next one
    if not out.exists():
        os.rename(staged, out)
    elif _renameat2_exchange(staged, out):
        _remove_ours(staged)  # now holds the old folder
    else:  # two renames; recover() puts the old folder back if we die between them
        old = _sibling(out, "old")
        if old.exists() or old.is_symlink():
            raise FolderError(
                f"{str(old)!r} is in the way of replacing {str(out)!r} and multihead did not make it; move or rename "
                "it, then retry"
            )
        os.rename(out, old)
        os.rename(staged, out)
        _remove_ours(old)
    _fsync_dir(out.parent)
    folder_lock.wrote(out / MANIFEST)  # an output published inside a folder being written: its manifest vouches


class Publish:
    """Build a folder of ``kind`` off to the side and publish it at ``out`` in one step::

        with Publish(out, "show", overwrite=args.overwrite) as folder:   # checks the target, takes the lock
            ...write files into folder...                                 # folder == parent/.NAME.new
        # on a clean exit the folder is swapped in; on an error (or a kill) ``out`` is untouched

    ``commit()`` may be called inside the block to publish early (the trainer does, once its run is resumable);
    later writes then go to ``out`` itself, still under the lock.
    """

    def __init__(
        self,
        out: str | Path,
        kind: str,
        *,
        overwrite: bool = False,
        sources: tuple = (),
        check: bool = True,
        replace_own: bool = True,
    ):
        self.out = Path(out)
        self.kind = kind
        self.overwrite = overwrite
        self.replace_own = replace_own
        self.sources = sources
        self.check = check
        self._lock = folder_lock(self.out)
        self.staged = _sibling(self.out, "new")
        self.path = self.staged
        self.committed = False

    def __enter__(self) -> Path:
        if self.check:
            check_target(
                self.out, self.kind, overwrite=self.overwrite, sources=self.sources, replace_own=self.replace_own
            )
        self._lock.__enter__()  # also recovers from a writer killed mid-swap
        try:
            self.staged.mkdir(parents=True)
            _mark_staging(self.staged)  # marks the folder as multihead's while it is built
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self.staged

    def commit(self) -> Path:
        if not self.committed:
            write_manifest(self.staged)  # every file written: what a later run may replace, and nothing else
            (self.staged / STAGING).unlink(missing_ok=True)
            swap_in(self.staged, self.out)
            self.committed = True
            self.path = self.out
        return self.out

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                try:
                    self.commit()
                except BaseException:  # e.g. the disk filled while the manifest was written: nothing half-built stays
                    if not self.committed:
                        _remove_ours(self.staged)
                    raise
            elif not self.committed:
                _remove_ours(self.staged)
        finally:
            self._lock.__exit__(None, None, None)


def cache_home() -> Path:
    """Where multihead keeps files it makes once and reuses (model copies for the benchmarks' peers), outside the
    repository: ``$XDG_CACHE_HOME/multihead`` (``~/.cache/multihead`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "multihead"


__all__ = [
    "FolderError",
    "cache_home",
    "file_lock",
    "JSONFileError",
    "read_json_file",
    "Publish",
    "atomic_save_figure",
    "atomic_write_bytes",
    "atomic_write_json",
    "lock_holder",
    "atomic_write_text",
    "check_target",
    "folder_kind",
    "folder_lock",
    "foreign_files",
    "foreign_manifest",
    "is_ours",
    "read_manifest",
    "recover",
    "write_manifest",
    "swap_in",
]
