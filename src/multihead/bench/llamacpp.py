"""llama.cpp as a decoding peer, through the CPU build that PyPI's ``gpt4all`` 2.8.2 ships (it loads on older glibc
machines where the newer llama.cpp wheels do not; install it with ``pip install --no-deps gpt4all==2.8.2`` and then
``requests``).

That build predates the ``smollm`` pre-tokenizer name that newer GGUF files carry, so the bench runs it on a copy of
the file whose metadata says ``gpt-2`` (the same byte-level BPE rules), written with the ``gguf`` package's own
metadata copier: ``as-is`` keeps the tensors as stored (SmolLM2's file: Q4_1 weights, a Q8_0 embedding), ``f32``
dequantises every tensor to float32 (multihead's precision, for a same-precision race). Copies are written once,
atomically, into a cache folder outside the repository (``$XDG_CACHE_HOME/multihead/llamacpp`` by default) and
reused while the source file is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace

PRE_TOKENIZER = "tokenizer.ggml.pre"
PRECISIONS = ("f32", "as-is")


def cache_dir() -> Path:
    from .._io import cache_home

    return cache_home() / "llamacpp"


def _stamp(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def llamacpp_copy(source: str | Path, precision: str = "f32", folder: str | Path | None = None) -> Path:
    """A copy of GGUF ``source`` that gpt4all's llama.cpp reads: pre-tokenizer ``gpt-2``, tensors as stored
    (``as-is``) or dequantised to float32 (``f32``). Written once per source file (its path, size and time)."""
    import gguf
    import numpy as np
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    source = Path(source)
    folder = Path(folder) if folder is not None else cache_dir()
    target = folder / f"{source.stem}-{precision}-{_stamp(source)}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        raise ValueError(f"{source} has no general.architecture: not a model GGUF file")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch.contents(), endianess=reader.endianess)
    if precision == "f32":
        tensors = []
        for t in reader.tensors:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            tensors.append(SimpleNamespace(name=t.name, data=data, tensor_type=gguf.GGMLQuantizationType.F32))
            tensors[-1].n_bytes = data.nbytes
        source_view = SimpleNamespace(fields=reader.fields, tensors=tensors, endianess=reader.endianess)
    else:
        source_view = reader
    new = {PRE_TOKENIZER: MetadataDetails(gguf.GGUFValueType.STRING, "gpt-2")}
    try:
        copy_with_new_metadata(source_view, writer, new, [])  # type: ignore[arg-type]
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


_MODELS: dict = {}


def load(path: str | Path, *, threads: int, context: int = 8192):
    """gpt4all's llama.cpp on ``path`` (CPU, no download), loaded once per process."""
    key = (str(path), threads, context)
    if key not in _MODELS:
        try:
            from gpt4all import GPT4All
        except ImportError:
            raise ValueError(
                "the llama.cpp peer needs gpt4all's CPU build: pip install --no-deps gpt4all==2.8.2 requests"
            ) from None
        p = Path(path)
        _MODELS[key] = GPT4All(
            p.name, model_path=str(p.parent), allow_download=False, device="cpu", n_threads=threads, n_ctx=context
        )
    return _MODELS[key]


def generate(model, prompt: str, new_tokens: int) -> dict:
    """Greedy decoding of up to ``new_tokens`` after ``prompt``; the token ids and the time of each (the first
    token's time ends the prompt's processing), so decode-only speed excludes the prompt."""
    times: list[float] = []
    ids: list[int] = []

    def seen(token_id: int, _text: str) -> bool:
        times.append(time.perf_counter())
        ids.append(int(token_id))
        return len(ids) < new_tokens

    t0 = time.perf_counter()
    model.generate(prompt, max_tokens=new_tokens, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, callback=seen)
    return {"ids": ids, "start": t0, "times": times}


__all__ = ["PRECISIONS", "cache_dir", "generate", "llamacpp_copy", "load"]
