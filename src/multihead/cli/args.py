"""Argument types and helpers shared by the subcommands: numbers checked at parse time, ``--set`` paths, texts
from arguments or a file.
"""

from __future__ import annotations

from dataclasses import dataclass

import argparse
import sys
import time

from .._config import MAX_NEEDLES  # one bound for the flags and the library (torch-free: --help stays fast)

STARTED = time.perf_counter()  # when the command line was first imported: a command's wall time counts from here


def since_start() -> float:
    """Seconds since the command started (its imports and the model's reading included): what a user waited."""
    return time.perf_counter() - STARTED


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _number(kind: type, lo: float, hi: float, what: str):
    """An argparse type for a number in ``[lo, hi]``: bad values are refused at parse time, before any work."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not lo <= value <= hi:  # NaN fails too
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_count = _number(int, 1, float("inf"), "a positive integer")  # batch sizes, thread counts, N, epochs


def _threads(text: str) -> int:
    """``--threads``: a positive integer, at most four per CPU (:func:`multihead._proc.max_threads`)."""
    from .._proc import max_threads

    return _number(int, 1, max_threads(), f"a thread count in [1, {max_threads()}] (four per CPU at most)")(text)


_nonneg = _number(int, 0, float("inf"), "an integer >= 0")  # counts where 0 means none / all

_port = _number(int, 0, 65535, "a TCP port in [0, 65535] (0: any free one)")

_needles = _number(int, 0, MAX_NEEDLES, f"a number of needle prompts in [0, {MAX_NEEDLES}]")


class LazyChoices:
    """``choices`` read from a module the first time argparse asks (the flag given, a usage error, that command's
    --help), so that building the parser imports no torch: ``multihead --help`` and usage errors stay fast."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def _values(self) -> list:
        import importlib

        return list(getattr(importlib.import_module(self.module), self.name))

    def __contains__(self, value) -> bool:
        return value in self._values()

    def __iter__(self):
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())


def _names(choices):
    """An argparse type for a comma-separated list of names from ``choices``."""

    def parse(text: str) -> list[str]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        bad = [n for n in names if n not in choices]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)} (comma-separated)")
        return names

    return parse


def _counts(text: str) -> list[int]:
    """:func:`_ints`, sorted, duplicates dropped (budgets, lengths: each measured once)."""
    return sorted(set(_ints(text)))


_fraction = _number(float, 0.0, 1.0, "a number in [0, 1]")


def _fractions(text: str) -> list[float]:
    """Comma-separated kept fractions, each in (0, 1]."""
    try:
        out = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        out = []
    if not out or not all(0.0 < f <= 1.0 for f in out):
        raise argparse.ArgumentTypeError(f"{text!r}: give fractions in (0, 1], comma-separated (e.g. 0.125,0.25)")
    return sorted(set(out))


_seconds = _number(float, 0.0, 1e9, "seconds (a finite number >= 0)")


def _words(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _set_path(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def _parse_value(text: str):
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _apply_sets(d: dict, items: list[str] | None) -> None:
    """``--set section.key=value`` (repeatable; the value parsed as JSON when it is JSON) into ``d``."""
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"--set expects section.key=value, e.g. --set optim.lr=3e-4; got {item!r}")
        key, value = item.split("=", 1)
        _set_path(d, key.strip(), _parse_value(value))


def _read_texts(texts: list[str], file: str | None) -> list[str]:
    from ..data import read_texts

    return list(texts) + (read_texts(file) if file else [])


def _head_list(text: str) -> list[tuple[int, int]]:
    out = []
    for item in _words(text):
        try:
            l, h = item.split(":")
            out.append((int(l), int(h)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LAYER:HEAD pairs like 1:8,5:3, got {item!r}") from None
    return out


def run_folder_options(p) -> None:
    """The options every training command shares: ``--set``, and what happens to the run folder at ``--out``."""
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="any other config field")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--log",
        choices=("none", "tensorboard"),
        default=None,
        help="experiment tracking: tensorboard writes event files in RUN/tensorboard (loss, lr, metrics, the "
        "curves); offline, nothing leaves the machine",
    )


def config_options(p, flags: dict, sections: str) -> None:
    """``--out``, ``--config FILE.toml`` and the command's flags (``{flag: (config path, type, help)}``)."""
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--config", default=None, help=f"TOML file with {sections}")
    for flag, (_, typ, help_) in flags.items():
        p.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None, help=help_)


def say_attached(p) -> None:
    """One line on stderr when a model was read by transformers and attached (asked for with hf:FOLDER, or no
    native family reads it)."""
    from ..pretrained import FAMILIES

    family = getattr(p, "family", "") or ""
    if family.startswith("hf:"):
        native = any(family[3:] in f.model_types for f in FAMILIES.values())
        why = "as asked (hf:FOLDER)" if native else "no native multihead family"
        print(f"{family[3:]}: {why}; read with transformers and attached (multihead.hf)", file=sys.stderr)


@dataclass(frozen=True)
class Route:
    """What a command handler answers where the source decides who serves it: the verb (``"heads --kv"`` is
    ``heads`` with its flag) and the source; the command line runs the function the verb x source table
    (:data:`multihead.cli.verbs.VERBS`) names for them."""

    verb: str
    source: object
