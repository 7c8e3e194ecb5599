"""llama.cpp as a decoding peer, through two engines (:data:`ENGINES`):

* ``xllamacpp`` -- a current llama.cpp from PyPI's ``xllamacpp`` wheel (its CPU build, no dependencies), driven
  in-process through its server's completion handler with the prompt's token ids, greedy, one row;
* ``gpt4all`` -- the 2024 CPU build that PyPI's ``gpt4all`` 2.8.2 ships (``pip install --no-deps gpt4all==2.8.2``
  and then ``requests``), which knows no BF16 tensors.

Both read copies of the GGUF file written with the ``gguf`` package (:func:`llamacpp_copy`): ``as-is`` keeps the
tensors as stored (SmolLM2's file: Q4_1 weights, a Q8_0 embedding), ``f32`` dequantises every tensor to float32
(multihead's precision, for a same-precision race), ``bf16``, ``q8_0`` and ``q4_1`` requantise every 2-D weight to that
type from the float32 values (norms and other 1-D tensors stay float32, as llama.cpp's own quantiser leaves them). gpt4all's
build predates the ``smollm`` pre-tokenizer name that newer files carry, so a copy's metadata says ``gpt-2`` (the same
byte-level BPE rules). Copies are written once, atomically, into a cache folder outside the repository
(``$XDG_CACHE_HOME/multihead/llamacpp`` by default) and reused while the source file is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace

PRE_TOKENIZER = "tokenizer.ggml.pre"
PRECISIONS = ("f32", "bf16", "q8_0", "q4_1", "as-is")
ENGINES = ("xllamacpp", "gpt4all")


def cache_dir() -> Path:
    from .._io import cache_home

    return cache_home() / "llamacpp"


def _stamp(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def llamacpp_copy(source: str | Path, precision: str = "f32", folder: str | Path | None = None) -> Path:
    """A copy of GGUF ``source`` that both engines read: pre-tokenizer ``gpt-2``, tensors as stored (``as-is``),
    dequantised to float32 (``f32``), or every 2-D weight requantised to ``bf16`` / ``q8_0`` / ``q4_1`` from its float32
    values.
    Written once per source file (its path, size and time)."""
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
    if precision != "as-is":
        to = {
            "f32": None,
            "bf16": gguf.GGMLQuantizationType.BF16,
            "q8_0": gguf.GGMLQuantizationType.Q8_0,
            "q4_1": gguf.GGMLQuantizationType.Q4_1,
        }[precision]
        tensors = []
        for t in reader.tensors:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            kind = gguf.GGMLQuantizationType.F32
            if to is not None and data.ndim == 2 and data.shape[-1] % gguf.GGML_QUANT_SIZES[to][0] == 0:
                data, kind = gguf.quants.quantize(data, to), to
            tensors.append(SimpleNamespace(name=t.name, data=data, tensor_type=kind, n_bytes=data.nbytes))
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


def load(path: str | Path, *, threads: int, context: int = 8192, engine: str = "gpt4all"):
    """llama.cpp (``engine``: :data:`ENGINES`) on ``path`` (CPU, no download), loaded once per process."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    key = (str(path), threads, context, engine)
    if engine == "xllamacpp" and key not in _MODELS:
        _MODELS[key] = XLlamaCpp(Path(path), threads=threads, context=context)
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


class XLlamaCpp:
    """A current llama.cpp (PyPI's ``xllamacpp``) on one GGUF file, in this process: its server's completion
    handler, one slot, greedy."""

    def __init__(self, path: Path, *, threads: int, context: int) -> None:
        try:
            import xllamacpp
        except ImportError:
            raise ValueError(f"the current llama.cpp peer needs xllamacpp: pip install --no-deps {XLLAMACPP}") from None
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = context
        params.n_parallel = 1
        params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
        params.sampling.temp = 0.0
        params.sampling.top_k = 1
        params.verbosity = -1
        self.server = xllamacpp.Server(params)
        self.version = getattr(xllamacpp, "__version__", None) or XLLAMACPP.split("==")[-1]
        self.system = xllamacpp.get_system_info().strip()

    def generate(self, prompt: list[int], new_tokens: int, callback) -> None:
        """Greedy, exactly ``new_tokens`` after the token ids ``prompt``; ``callback(token_id)`` as each is made."""
        failed: list = []

        def chunk(part) -> None:
            if isinstance(part, dict) and "error" in part:
                failed.append(part["error"])
            for choice in part.get("choices", []) if isinstance(part, dict) else []:
                for made in (choice.get("logprobs") or {}).get("content") or []:  # each token's id, as it is made
                    callback(int(made["id"]))

        request = {
            "prompt": list(prompt),
            "n_predict": new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "stream": True,
            "ignore_eos": True,
            "n_probs": 1,  # the OpenAI-style stream names each token's id only beside its probability (a softmax a token)
            "cache_prompt": False,
        }
        self.server.handle_completions(request, chunk)
        if failed:
            raise RuntimeError(f"llama.cpp (xllamacpp) refused the request: {failed[0]}")


XLLAMACPP = "xllamacpp==2026.10.11549"


def generate(model, prompt: str | list[int], new_tokens: int) -> dict:
    """Greedy decoding of up to ``new_tokens`` after ``prompt`` (text; token ids for ``xllamacpp``); the token
    ids and the time of each (the first token's time ends the prompt's processing), so decode-only speed excludes
    the prompt."""
    times: list[float] = []
    ids: list[int] = []

    def seen(token_id: int, _text: str) -> bool:
        times.append(time.perf_counter())
        ids.append(int(token_id))
        return len(ids) < new_tokens

    t0 = time.perf_counter()
    if isinstance(model, XLlamaCpp):
        model.generate(prompt, new_tokens, lambda token: seen(token, ""))
    else:
        model.generate(prompt, max_tokens=new_tokens, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, callback=seen)
    return {"ids": ids, "start": t0, "times": times}


__all__ = ["ENGINES", "PRECISIONS", "XLlamaCpp", "cache_dir", "generate", "llamacpp_copy", "load"]
