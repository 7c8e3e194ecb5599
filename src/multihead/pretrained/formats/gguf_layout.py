"""A GGUF file's layout, checked before the ``gguf`` package reads it.

The ``gguf`` package's reader trusts the file: it walks every metadata array element by element (an array that
declares 10^8 or 2^62 elements keeps it busy for minutes, nested arrays recurse until Python gives up), adds tensor
offsets in unsigned 64-bit arithmetic (an offset near 2^64 wraps around to a valid-looking position), and accepts
tensors that overlap, are unaligned, or whose type disagrees with the bytes they occupy. Any of those gives a model
that loads and talks nonsense. :func:`scan` walks the same structure first, with every count bounded by the bytes
left in the file before anything is read, and checks the tensor data section as llama.cpp and the ``gguf`` writer
lay it out: every tensor aligned, inside the data section, its size equal to its type times its shape, and the
tensors filling the section in order with only alignment padding between them. Nothing here allocates more than the
file's header region; values are read later by the ``gguf`` package.

The layout (GGUF v2/v3, little-endian)::

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata: key (u64 length + UTF-8) | value type u32 | value
        value: scalar | string (u64 length + bytes) | array (item type u32, count u64, items)
    tensor infos: name | n_dims u32 | dims u64 x n_dims (innermost first) | ggml type u32 | offset u64
    padding to the alignment (general.alignment, default 32), then the data section
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LMError

MAGIC = b"GGUF"
MAX_COUNT = 1 << 20  # tensors or metadata entries a header may declare
MAX_STRINGS = 1 << 21  # items of one string array (vocabularies and merges have at most a few hundred thousand)
MAX_KEY = 1 << 10  # bytes of a metadata key or tensor name
MAX_DEPTH = 2  # arrays of arrays at most (GGUF writers nest no deeper)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 40  # elements of one tensor
DEFAULT_ALIGNMENT = 32

# value type -> (name, byte size of a scalar); STRING = 8 and ARRAY = 9 have no fixed size
SCALARS = {
    0: ("uint8", 1),
    1: ("int8", 1),
    2: ("uint16", 2),
    3: ("int16", 2),
    4: ("uint32", 4),
    5: ("int32", 4),
    6: ("float32", 4),
    7: ("bool", 1),
    10: ("uint64", 8),
    11: ("int64", 8),
    12: ("float64", 8),
}
STRING, ARRAY = 8, 9
INTEGERS = {0, 1, 2, 3, 4, 5, 10, 11}
FLOATS = {6, 12}


def type_name(vtype: int, item: int | None = None) -> str:
    if vtype == ARRAY:
        return f"an array of {type_name(item) if item is not None else '?'}"
    if vtype == STRING:
        return "a string"
    return SCALARS[vtype][0] if vtype in SCALARS else f"type {vtype}"


@dataclass(frozen=True)
class Field:
    """One metadata entry: its key, value type (and item type for arrays), item count, and the byte span of the
    whole entry (``start``..``end``) with the positions of its structural parts (lengths, types, counts)."""

    key: str
    vtype: int
    item: int | None
    count: int
    start: int
    end: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: name, dims as stored (innermost first), ggml type, offset into the data section, the
    bytes its type and shape take, and where its entry sits in the file."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int
    start: int
    end: int


@dataclass
class Layout:
    version: int
    alignment: int
    size: int
    data_start: int
    fields: dict[str, Field] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    structural: list[tuple[int, int]] = field(default_factory=list)  # byte spans of lengths, types, counts, dims


class _Cursor:
    def __init__(self, path: Path, buf, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0
        self.structural: list[tuple[int, int]] = []

    def fail(self, what: str) -> LMError:
        return LMError(f"{self.path}: {what}; the file is truncated or corrupt: download or convert it again")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} at byte {self.pos:,} needs {n:,} bytes but the file ends at {self.size:,}")

    def unpack(self, fmt: str, what: str, *, structural: bool = True):
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        if structural:
            self.structural.append((self.pos, self.pos + n))
        self.pos += n
        return value

    def string(self, what: str, limit: int | None = None) -> bytes:
        n = self.unpack("Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} declares {n:,} bytes (at most {limit:,} are read)")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw

    def text(self, what: str, limit: int) -> str:
        raw = self.string(what, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None

    def skip_value(self, vtype: int, what: str, depth: int = 0) -> tuple[int | None, int]:
        """Skip one value of ``vtype``; ``(item type, count)`` for arrays. Every count is bounded by the bytes left
        before the items are walked."""
        if vtype in SCALARS:
            self.need(SCALARS[vtype][1], what)
            self.pos += SCALARS[vtype][1]
            return None, 1
        if vtype == STRING:
            self.string(what)
            return None, 1
        if vtype != ARRAY:
            raise self.fail(f"{what} has value type {vtype}, which GGUF does not define")
        if depth >= MAX_DEPTH:
            raise self.fail(f"{what} nests arrays deeper than {MAX_DEPTH} levels, which no GGUF writer does")
        item = self.unpack("I", f"the item type of {what}")
        count = self.unpack("Q", f"the item count of {what}")
        left = self.size - self.pos
        if item in SCALARS:
            self.need(count * SCALARS[item][1], f"{what} ({count:,} items of {type_name(item)})")
            self.pos += count * SCALARS[item][1]
            return item, count
        least = 8 if item == STRING else 12  # a string's length, or a nested array's type and count
        if item not in (STRING, ARRAY):
            raise self.fail(f"{what} holds items of value type {item}, which GGUF does not define")
        if count * least > left or count > MAX_STRINGS:
            raise self.fail(
                f"{what} declares {count:,} items of {type_name(item)}, more than the {left:,} bytes left can hold "
                f"(or than the {MAX_STRINGS:,} any vocabulary needs)"
            )
        for i in range(count):
            self.skip_value(item, f"item {i} of {what}", depth + 1)
        return item, count


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _tensor_bytes(cur: _Cursor, name: str, dims: tuple[int, ...], ggml_type: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(ggml_type)
        block, size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise cur.fail(f"tensor {name!r} has ggml type {ggml_type}, which the gguf package does not know") from None
    if dims[0] % block:
        raise cur.fail(
            f"tensor {name!r} of type {qtype.name} has rows of {dims[0]} values, not a multiple of its block of {block}"
        )
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


def scan(path: str | Path) -> Layout:
    """The file's layout, every part checked against the file's size and GGUF's rules (module docstring);
    :class:`~multihead.pretrained.errors.LMError` names what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size < 24:
                raise LMError(f"{path} is {size} bytes, too short for a GGUF header; it is not a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _scan(path, buf, size)
    except OSError as exc:
        raise LMError(f"cannot read {path}: {exc.strerror or exc}") from None


def _scan(path: Path, buf, size: int) -> Layout:
    cur = _Cursor(path, buf, size)
    if bytes(buf[:4]) != MAGIC:
        raise LMError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic and header); pass a .gguf file, an HF "
            "model folder, or a short name"
        )
    cur.pos = 4
    version = cur.unpack("I", "the version")
    if version not in (2, 3):
        raise LMError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensors, entries = cur.unpack("Q", "the tensor count"), cur.unpack("Q", "the metadata count")
    if tensors > MAX_COUNT or entries > MAX_COUNT or tensors * 24 + entries * 16 > size:
        raise cur.fail(
            f"the header declares {tensors:,} tensors and {entries:,} metadata entries, more than a {size:,}-byte "
            "file can hold"
        )
    layout = Layout(version, DEFAULT_ALIGNMENT, size, 0)
    for _ in range(entries):
        start = cur.pos
        key = cur.text(f"metadata key {len(layout.fields)}", MAX_KEY)
        if key in layout.fields:
            raise cur.fail(f"metadata {key!r} appears twice")
        vtype = cur.unpack("I", f"the value type of {key!r}")
        item, count = cur.skip_value(vtype, f"metadata {key!r}")
        layout.fields[key] = Field(key, vtype, item, count, start, cur.pos)
        if key == "general.alignment":
            if vtype != 4:
                raise cur.fail(f"general.alignment is {type_name(vtype, item)}, not uint32")
            alignment = struct.unpack_from("<I", buf, cur.pos - 4)[0]
            if alignment == 0 or alignment & (alignment - 1):
                raise cur.fail(f"general.alignment is {alignment}, not a power of two")
            layout.alignment = alignment
    seen: set[str] = set()
    for i in range(tensors):
        start = cur.pos
        name = cur.text(f"the name of tensor {i}", MAX_KEY)
        if name in seen:
            raise cur.fail(f"tensor {name!r} appears twice")
        seen.add(name)
        n_dims = cur.unpack("I", f"the rank of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name!r} declares {n_dims} dimensions (GGUF tensors have 1 to {MAX_DIMS})")
        dims = tuple(cur.unpack("Q", f"a dimension of {name!r}") for _ in range(n_dims))
        elements = 1
        for d in dims:
            elements *= d
        if min(dims) < 1 or elements > MAX_ELEMENTS:
            raise cur.fail(f"tensor {name!r} declares dimensions {list(dims)}")
        ggml_type = cur.unpack("I", f"the type of {name!r}")
        offset = cur.unpack("Q", f"the offset of {name!r}")
        nbytes = _tensor_bytes(cur, name, dims, ggml_type)
        layout.tensors.append(TensorInfo(name, dims, ggml_type, offset, nbytes, start, cur.pos))
    layout.data_start = _align(cur.pos, layout.alignment)
    layout.structural = cur.structural
    _check_data(cur, layout)
    return layout


def _check_data(cur: _Cursor, layout: Layout) -> None:
    """Every tensor aligned and inside the data section, the tensors in order without overlaps or gaps (a gap means
    a tensor's type or shape was changed: its bytes no longer match what it says it holds)."""
    room = layout.size - layout.data_start
    if room < 0:
        raise cur.fail(f"the data section would start at byte {layout.data_start:,}, past the end of the file")
    for t in layout.tensors:
        if t.offset % layout.alignment:
            raise cur.fail(
                f"tensor {t.name!r} starts at offset {t.offset:,}, not a multiple of the file's alignment "
                f"({layout.alignment})"
            )
        if t.offset + t.nbytes > room:
            raise cur.fail(
                f"tensor {t.name!r} spans bytes {t.offset:,} to {t.offset + t.nbytes:,} of a data section of "
                f"{room:,} bytes"
            )
    end = 0
    for t in sorted(layout.tensors, key=lambda t: t.offset):
        if t.offset < end:
            raise cur.fail(
                f"tensor {t.name!r} starts at offset {t.offset:,}, inside the tensor before it (which ends at {end:,})"
            )
        if t.offset != _align(end, layout.alignment):
            raise cur.fail(
                f"tensor {t.name!r} starts at offset {t.offset:,} but the tensor before it ends at {end:,}: a gap "
                "no GGUF writer leaves, so some tensor's type or shape does not match its bytes"
            )
        end = t.offset + t.nbytes


__all__ = ["Field", "Layout", "TensorInfo", "scan"]
