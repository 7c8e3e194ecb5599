"""The product a decoding step streams its weights with, chosen by measurement on the machine it runs on.

A decoding step of one row multiplies that row by every weight of the model: it is bound by how fast the weights
stream from memory, and which product streams them fastest depends on the CPU. Two candidates are registered
(:data:`KERNELS`):

* ``blas`` -- the BLAS's product over each weight laid out by columns (``in x out`` contiguous): the lean step of
  :mod:`multihead.models.fast_decode` on :func:`multihead.modules.fastpath.prepare`'s default layout;
* ``compiled`` -- inductor's fused row-by-row reduction over each weight laid out by rows: the compiled step
  (:func:`multihead.models.fast_decode.compile`). It needs a C++ compiler.

On one 2-core Xeon the BLAS's product took 37 ms a step of SmolLM2-135M and inductor's 24; on another of the same
kind, 25.7 and 40.8. A fixed choice is wrong somewhere, so :func:`choose` measures: the candidates' products over
weights of the model's own shapes and size (at most :data:`WORKING_SET` bytes; a step streams them all, from memory
or, on a CPU whose last-level cache holds them, from there), alternated, for about :data:`BUDGET_S` seconds each, and
keeps the fastest per machine -- CPU model and extensions, torch version, threads, dtype and shapes -- in
``$XDG_CACHE_HOME/multihead/decode-kernels.json``. The next process on that machine reads it back.

``MULTIHEAD_DECODE_KERNEL=blas`` or ``compiled`` decides instead of measuring (``auto``, the default, measures). A
cache file that cannot be written, or that holds something else, changes nothing but the cost of measuring again:
the reason is said once, as a warning.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._io import atomic_write_json, cache_home, read_json_file
from .._proc import cpu_model
from .precision import own_code, rowwise

ENV = "MULTIHEAD_DECODE_KERNEL"
ASKED = ("auto", "blas", "compiled")
FILE = "decode-kernels.json"
BUDGET_S = 0.3  # seconds of products per candidate
WORKING_SET = 2**30  # the most bytes of weights a measurement streams per candidate (a model's own size below it)
FORMAT = 1  # the version of the cache file's layout
REVISION = 2  # the version of the candidates' own code: a choice measured on an older one is measured again


# ---------------------------------------------------------------------------------------------------- candidates
@functools.cache
def why_not_inductor() -> str | None:
    """Why ``torch.compile`` cannot build CPU code in this process (None: it can), tried once on a tiny function:
    inductor needs a C++ compiler and the headers it includes."""
    try:
        tiny = torch.compile(lambda x: (x[..., None, :] * x).sum(-1), dynamic=False, fullgraph=True)
        tiny(torch.ones(2, 3))
    except Exception as e:  # the compiler missing, headers missing, ...: the reason, for a refusal or a skip
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    return None


@dataclass(frozen=True)
class Kernel:
    """A way to multiply one row by a weight: ``timer(shapes, dtype)`` makes weights of ``shapes`` ``(out, in)``
    laid out its way and answers a function that multiplies a row by each of them once; ``why_not()`` says why it
    cannot run here."""

    name: str
    about: str
    timer: Callable[[list[tuple[int, int]], torch.dtype], Callable[[], None]]
    why_not: Callable[[], str | None] = lambda: None


def _filled(rows: int, cols: int, dtype: torch.dtype) -> Tensor:
    """A ``rows x cols`` row-major weight whose every page is written (a page never written reads as the shared zero
    page: faster than memory)."""
    return torch.empty(rows, cols, dtype=dtype).fill_(0.01)


def _blas(shapes: list[tuple[int, int]], dtype: torch.dtype) -> Callable[[], None]:
    laid = [
        _filled(i, o, dtype).t() for o, i in shapes
    ]  # (out, in) views of column-major buffers, as prepare lays them
    rows = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in laid}

    def run() -> None:
        for w in laid:
            F.linear(rows[w.shape[1]], w)

    return run


def _compiled(shapes: list[tuple[int, int]], dtype: torch.dtype) -> Callable[[], None]:
    product = torch.compile(own_code(rowwise), dynamic=False, fullgraph=True)  # the compiled step's own product
    laid = [_filled(o, i, dtype) for o, i in shapes]  # row-major, as the compiled step reads them
    rows = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in laid}

    def run() -> None:
        for w in laid:
            product(rows[w.shape[1]], w, None)

    return run


KERNELS: dict[str, Kernel] = {}  # the one list of candidates: a new one plugs in here


def register(kernel: Kernel) -> Kernel:
    KERNELS[kernel.name] = kernel
    return kernel


register(Kernel("blas", "the BLAS's product, weights by columns (the lean step)", _blas))
register(
    Kernel("compiled", "inductor's fused reduction, weights by rows (the compiled step)", _compiled, why_not_inductor)
)


def _stored(fmt: str, shapes: list[tuple[int, int]]) -> list[tuple[Tensor, Tensor]]:
    """Weights of ``shapes`` stored in ``fmt``, every page written, with their per-row scales."""
    dtype = torch.int8 if fmt == "int8" else torch.bfloat16
    return [(torch.empty(o, i, dtype=dtype).fill_(1), torch.full((o,), 0.01)) for o, i in shapes]


def _library(fmt: str):
    def timer(shapes: list[tuple[int, int]], dtype: torch.dtype) -> Callable[[], None]:
        laid = _stored(fmt, shapes)
        rows = {i: torch.randn(1, i) for _, i in shapes}

        def run() -> None:
            for w, s in laid:
                x = rows[w.shape[1]]
                if fmt == "int8":
                    torch.ops.aten._weight_int8pack_mm(x, w, s)
                else:
                    F.linear(x.to(torch.bfloat16), w).float()

        return run

    return timer


def _reduced(fmt: str):
    def timer(shapes: list[tuple[int, int]], dtype: torch.dtype) -> Callable[[], None]:
        from .precision import reduction, words

        rows = {i: torch.randn(1, i) for _, i in shapes}
        laid = [(reduction(fmt, tuple(w.shape)), rows[w.shape[1]], words(w), s) for w, s in _stored(fmt, shapes)]

        def run() -> None:
            for product, x, w, s in laid:
                product(x, w, s)

        return run

    return timer


# The candidates for weights stored in another format (multihead.models.precision): the product a row takes there.
FORMATS: dict[str, dict[str, Kernel]] = {
    fmt: {
        "library": Kernel("library", f"PyTorch's {fmt} product", _library(fmt)),
        "compiled": Kernel(
            "compiled", f"inductor's fused reduction over {fmt} weights", _reduced(fmt), why_not_inductor
        ),
    }
    for fmt in ("bf16", "int8")
}


# ---------------------------------------------------------------------------------------------------- the choice
@dataclass
class Choice:
    """The kernel a model decodes with on this machine, and why: ``seconds`` per candidate (one pass over the
    measured weights; the least of the rounds), ``source`` (``measured``, ``kept``: read from the cache file,
    ``asked``: set by :data:`ENV`, ``only``: one candidate runs here), the candidates that cannot run and why, the
    machine ``key`` it holds for, and ``note``: what went wrong with the cache file, if anything."""

    kernel: str
    source: str
    key: dict
    seconds: dict[str, float] = field(default_factory=dict)
    cannot: dict[str, str] = field(default_factory=dict)
    note: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {}, [])}

    def why(self) -> str:
        """One line: what was chosen and why."""
        if self.source == "asked":
            return f"{self.kernel}: {ENV} asks for it"
        if self.source == "only":
            return f"{self.kernel}: the only kernel that runs here ({'; '.join(self.cannot.values())})"
        times = ", ".join(f"{k} {1000 * s:.1f} ms" for k, s in sorted(self.seconds.items(), key=lambda kv: kv[1]))
        how = "measured now" if self.source == "measured" else "measured earlier on this machine"
        if self.key.get("timed") == "steps":
            return f"{self.kernel}: the fastest here, {how} ({times} a decoding step)"
        return f"{self.kernel}: the fastest here, {how} ({times} over {self.key['measured_mb']} MB of weights)"


def asked() -> str:
    """The kernel :data:`ENV` asks for (``auto``: measure), or a refusal naming the choices."""
    value = os.environ.get(ENV, "auto").strip() or "auto"
    if value not in ASKED:
        raise ValueError(f"{ENV}={value!r} names no decoding kernel; set it to one of {', '.join(ASKED)} (or unset it)")
    return value


def linear_weights(model: nn.Module) -> list[Tensor]:
    """The 2-D weights of ``model``'s linear layers (tied ones once), in the order a step reads them."""
    seen: dict[tuple, Tensor] = {}
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(m, nn.Linear) and isinstance(w, Tensor) and w.dim() == 2:
            seen.setdefault((w.untyped_storage().data_ptr(), w.storage_offset(), tuple(w.shape)), w)
    return list(seen.values())


def machine_key(weights: list[Tensor]) -> dict:
    """What a choice holds for: this machine's CPU, torch and threads, the model's shapes and dtype, and the
    candidates' revision."""
    shapes = sorted({tuple(w.shape) for w in weights})
    dtypes = sorted({str(w.dtype).removeprefix("torch.") for w in weights})
    cpu = cpu_model()
    return {
        "cpu": cpu.get("cpu"),
        "cpu_flags": cpu.get("cpu_flags", []),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": ",".join(dtypes),
        "shapes": [list(s) for s in shapes],
        "revision": REVISION,
    }


def choose(
    model: nn.Module, *, folder=None, budget: float = BUDGET_S, fmt: str | None = None, steps: dict | None = None
) -> Choice:
    """The kernel ``model`` decodes fastest with on this machine: asked for (:data:`ENV`), kept from an earlier
    measurement on this machine (``folder``'s :data:`FILE`, default the user's cache folder), or measured now
    and kept. A problem with the file is said once (a warning) and otherwise changes nothing. ``fmt``: the format
    its linear weights are stored in (:mod:`multihead.models.precision`): the candidates are that format's
    (:data:`FORMATS`; ``blas`` asked for is PyTorch's library product there). ``steps``: per candidate, a function
    that prepares the model to decode with it and answers one whole decoding step of the model; given, the
    candidates are timed as those steps instead of as their products (and kept apart from product timings)."""
    want = asked()
    candidates = KERNELS if fmt is None else FORMATS[fmt]
    if fmt is None:
        weights = linear_weights(model)
    else:  # shapes and bytes of the stored weights (meta tensors: nothing allocated)
        from .precision import stored_shapes

        dtype = torch.int8 if fmt == "int8" else torch.bfloat16
        weights = [torch.empty(shape, dtype=dtype, device="meta") for shape in stored_shapes(model)]
        want = {"blas": "library"}.get(want, want)
    key = machine_key(weights)
    if steps is not None:
        key["timed"] = "steps"
    if want != "auto":  # only the kernel asked for is tried
        why = candidates[want].why_not()
        if why is not None:
            raise ValueError(f"{ENV}={want} cannot run here: {why}; set it to auto or another kernel")
        return Choice(want, "asked", key)
    cannot = {name: why for name, k in candidates.items() if (why := k.why_not()) is not None}
    usable = [name for name in candidates if name not in cannot]
    if steps is not None:  # a candidate whose step cannot serve this model
        cannot.update({n: "its decoding step cannot serve this model" for n in usable if n not in steps})
        usable = [n for n in usable if n in steps]
    if not weights:  # nothing to stream: the products do not matter
        cannot = {**cannot, "measured": "the model has no linear layer to time"}
        usable = usable[:1]
    if len(usable) == 1:
        return Choice(usable[0], "only", key, cannot=cannot)
    path = Path(cache_home() if folder is None else folder) / FILE
    kept, note = _read(path)
    entry = kept.get(_id(key))
    if entry is not None and entry.get("kernel") in usable:
        key["measured_mb"] = entry.get("measured_mb")
        return Choice(entry["kernel"], "kept", key, dict(entry.get("seconds", {})), cannot, note)
    try:
        if steps is not None:
            seconds, mb = _race({name: steps[name] for name in usable}, budget), None
        else:
            seconds, mb = _measure(weights, {name: candidates[name] for name in usable}, budget)
    except (RuntimeError, MemoryError, ValueError) as e:  # a candidate failed to build or run: the first serves
        said = (
            f"the decoding kernels could not be measured here ({type(e).__name__}: {str(e)[:200]}); {usable[0]} serves"
        )
        say_once(said)
        return Choice(usable[0], "only", key, cannot={**cannot, "measured": said}, note=note)
    key["measured_mb"] = mb
    choice = Choice(min(seconds, key=seconds.__getitem__), "measured", key, seconds, cannot, note)
    kept[_id(key)] = {"kernel": choice.kernel, "seconds": seconds, "measured_mb": mb, "time": time.strftime("%F %T")}
    unkept = _write(path, kept)
    choice.note = "; ".join(n for n in (note, unkept) if n) or None
    if choice.note:
        say_once(choice.note)
    return choice


def _id(key: dict) -> str:
    return json.dumps({k: v for k, v in key.items() if k != "measured_mb"}, sort_keys=True)


def _read(path) -> tuple[dict, str | None]:
    """The choices kept in ``path`` (``{machine id: entry}``) and what was wrong with the file, if anything."""
    if not path.exists() and not path.is_symlink():
        return {}, None
    try:
        data = read_json_file(path, max_bytes=4 * 2**20)
    except (ValueError, OSError) as e:  # not JSON, too large or deep (JSONFileError), unreadable
        return {}, f"the decoding kernels kept in {path} could not be read ({e}); measured again"
    choices = data.get("choices") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(choices, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("kernel"), str) and isinstance(v.get("seconds", {}), dict)
        for v in choices.values()
    ):
        return {}, f"{path} does not hold multihead's decoding kernel choices; measured again, and it is replaced"
    return dict(choices), None


def _write(path, kept: dict) -> str | None:
    """Keep the choices in ``path``; what prevented it, if anything (decoding goes on either way)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"format": FORMAT, "choices": kept})
    except OSError as e:
        return (
            f"the decoding kernel chosen here could not be kept in {path} ({type(e).__name__}: {e}); it is measured "
            f"again in each process (set {ENV} to skip measuring)"
        )
    return None


_SAID: set[str] = set()


def say_once(note: str) -> None:
    """A warning, once per process for each note."""
    if note not in _SAID:
        _SAID.add(note)
        warnings.warn(note, RuntimeWarning, stacklevel=3)


def _race(builds: dict[str, Callable[[], Callable[[], None]]], budget: float) -> dict[str, float]:
    """Each candidate's least time for one call of the function its build answers (called once untimed first:
    compilation, the first pass), the candidates alternated round by round: at least three rounds, then until
    ``budget`` seconds per candidate."""
    with torch.no_grad():
        runs = {}
        for name, build in builds.items():
            runs[name] = build()
            runs[name]()  # warm-up
        best = dict.fromkeys(runs, float("inf"))
        start, rounds = time.perf_counter(), 0
        while rounds < 3 or (time.perf_counter() - start < budget * len(runs) and rounds < 1000):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - t0)
            rounds += 1
    return {k: round(v, 6) for k, v in best.items()}


def _measure(weights: list[Tensor], candidates: dict[str, Kernel], budget: float) -> tuple[dict[str, float], float]:
    """Each candidate's least time for one pass over weights of the model's shapes, in the model's order, as many as
    make the model's size (at most :data:`WORKING_SET` bytes: past any CPU's last-level cache, so that they stream
    from memory as a step's do), the candidates alternated round by round."""
    total = sum(w.numel() * w.element_size() for w in weights)
    want = min(total, WORKING_SET)
    shapes: list[tuple[int, int]] = []
    size, i = 0, 0
    while size < want:  # the model's weights in their order, cycled (a cap below the model's size cuts them)
        w = weights[i % len(weights)]
        shapes.append((int(w.shape[0]), int(w.shape[1])))
        size += w.numel() * w.element_size()
        i += 1
    dtype = weights[0].dtype
    builds = {name: functools.partial(kernel.timer, shapes, dtype) for name, kernel in candidates.items()}
    return _race(builds, budget), round(size / 2**20, 1)


__all__ = [
    "ASKED",
    "BUDGET_S",
    "ENV",
    "FILE",
    "KERNELS",
    "Choice",
    "Kernel",
    "asked",
    "choose",
    "linear_weights",
    "machine_key",
    "register",
    "say_once",
    "why_not_inductor",
]
