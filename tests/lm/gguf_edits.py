"""Hostile GGUF files made from a good one: metadata rewritten with the gguf package's own writer, raw entries the
writer cannot make (nested arrays thousands deep, counts of 2^62) inserted as bytes, and tensor offsets patched in
place at the positions the layout scan reports."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from multihead.pretrained.formats.gguf_layout import scan


def rewrite(src, dst, *, meta: dict | None = None, drop: tuple = (), tensors: dict | None = None) -> Path:
    """A copy of ``src`` with metadata entries replaced (``meta``: key -> ``(value, GGUFValueType[, item type])``)
    or dropped, and tensors replaced (``tensors``: name -> ``(array, GGMLQuantizationType)``)."""
    import gguf

    meta, tensors = meta or {}, tensors or {}
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop or key in meta:
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for key, spec in meta.items():
        w.add_key_value(key, *spec)
    for t in r.tensors:
        if t.name in tensors:
            array, dtype = tensors[t.name]
            w.add_tensor(t.name, array, raw_dtype=dtype)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def insert_entry(src, dst, key: str, vtype: int, payload: bytes) -> Path:
    """``src`` with one more metadata entry (raw bytes after its type), placed after the others; the key is padded
    so that the entry's length keeps the data section aligned."""
    data = bytearray(Path(src).read_bytes())
    layout = scan(src)
    at = layout.tensors[0].start if layout.tensors else layout.data_start
    while (8 + len(key) + 4 + len(payload)) % layout.alignment:
        key += "_"
    entry = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload
    entries = struct.unpack_from("<Q", data, 16)[0]
    struct.pack_into("<Q", data, 16, entries + 1)
    data[at:at] = entry
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


def nested_array(depth: int) -> bytes:
    """An array of arrays ``depth`` deep, ending in an empty array of uint8."""
    return b"".join(struct.pack("<IQ", 9, 1) for _ in range(depth - 1)) + struct.pack("<IQ", 0, 0)


def patch_offset(src, dst, name: str, offset: int) -> Path:
    """``src`` with tensor ``name``'s data offset set to ``offset`` (its last 8 bytes of tensor info)."""
    data = bytearray(Path(src).read_bytes())
    t = next(t for t in scan(src).tensors if t.name == name)
    struct.pack_into("<Q", data, t.end - 8, offset)
    Path(dst).write_bytes(bytes(data))
    return Path(dst)
