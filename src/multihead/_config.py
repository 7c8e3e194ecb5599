"""The one place configs are validated: dataclass configs from plain dicts (JSON, TOML, ``--set``), checked for
unknown fields, types, ranges and size ceilings *before* anything is built or allocated.

Types are checked by `pydantic <https://docs.pydantic.dev>`_ (v2) against the dataclasses' own annotations through
``TypeAdapter``: the configs stay plain ``dataclasses`` (no base class, no runtime dependency for users who build
them in Python), yet a file or flag that says ``lr = "abc"``, ``epochs = 2.5`` or ``layers = [1]`` gets a message
naming the field, what was expected and what was given. Chosen over hand-written ``isinstance`` checks because it
already handles ``int | None``, nested dataclasses, bool/int/float coercion rules and error locations, and is
widely used and maintained; ranges and ceilings are ours, in :data:`RANGES` below, next to the types they refine.

Ceilings (largest model a config file may ask for) are configurable through the environment:
``MULTIHEAD_MAX_PARAMETERS`` (default 2e9), ``MULTIHEAD_MAX_LAYERS`` (1024), ``MULTIHEAD_MAX_VOCAB`` (2,000,000),
``MULTIHEAD_MAX_CLASSES`` (100,000), ``MULTIHEAD_MAX_POSITIONS`` (1,048,576).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from functools import cache

MAX_NEEDLES = 256  # needle prompts are thousands of tokens each: 256 is hours of reading; more is a typo


class ConfigError(ValueError):
    """A config value of the wrong type, out of range or over a ceiling; the message names the field and the fix."""


def ceiling(name: str, default: float) -> float:
    """A size ceiling: ``MULTIHEAD_MAX_<NAME>`` from the environment, else ``default``."""
    raw = os.environ.get(f"MULTIHEAD_MAX_{name.upper()}")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"MULTIHEAD_MAX_{name.upper()}={raw!r} is not a number") from None
    return value


# (lowest, highest, lowest included, highest included); a str highest names a ceiling(); None = unbounded.
RANGES: dict[str, dict[str, tuple]] = {
    "EncoderConfig": {
        "d_model": (1, 1 << 16, True, True),
        "num_heads": (1, 4096, True, True),
        "num_layers": (0, "layers", True, True),
        "d_ff": (1, 1 << 20, True, True),
        "dropout": (0, 1, True, False),
        "layer_norm_eps": (0, 1, False, True),
    },
    "AttentionConfig": {
        "num_kv_heads": (1, 4096, True, True),
        "dropout": (0, 1, True, False),
        "mla_latent": (0, 1 << 16, True, True),
        "mla_rope_dim": (2, 4096, True, True),
        "head_dim": (1, 4096, True, True),
    },
    "TextEncoderConfig": {
        "vocab_size": (1, "vocab", True, True),
        "max_len": (1, "positions", True, True),
        "pad_id": (0, None, True, True),
        "embed_init_std": (0, None, False, True),
        "type_vocab_size": (0, 1 << 16, True, True),
    },
    "ClassifierConfig": {"num_classes": (1, "classes", True, True)},
    "DataConfig": {
        "split_seed": (0, None, True, True),
        "validation": (0, 1, False, False),
        "test": (0, 1, False, False),
        "max_len": (3, "positions", True, True),
        "vocab_size": (8, "vocab", True, True),
        "min_frequency": (0, None, True, True),
        "limit": (1, None, True, True),
        "eval_limit": (1, None, True, True),
    },
    "OptimConfig": {
        "epochs": (1, 100_000, True, True),
        "batch_size": (1, 1 << 20, True, True),
        "lr": (0, 10, False, True),
        "weight_decay": (0, None, True, True),
        "warmup": (0, 1, True, True),
        "clip": (0, None, True, True),
        "patience": (0, None, True, True),
        "label_smoothing": (0, 1, True, False),
        "token_dropout": (0, 1, True, False),
        "ema_decay": (0, 1, True, False),
    },
    "RunConfig": {
        "seed": (0, (1 << 63) - 1, True, True),
        "threads": (1, 4096, True, True),
        "save_every": (0, None, True, True),
    },
    "PretrainedConfig": {"layer_decay": (0, 1, False, True)},
    "DecoderConfig": {
        "d_model": (1, 1 << 16, True, True),
        "num_heads": (1, 4096, True, True),
        "num_layers": (0, "layers", True, True),
        "d_ff": (0, 1 << 20, True, True),
        "dropout": (0, 1, True, False),
        "layer_norm_eps": (0, 1, False, True),
        "rope_theta": (1, 1e12, False, True),
    },
    "CausalLMConfig": {
        "vocab_size": (1, "vocab", True, True),
        "max_len": (1, "positions", True, True),
        "pad_id": (0, None, True, True),
    },
    "Seq2SeqConfig": {
        "src_vocab_size": (1, "vocab", True, True),
        "tgt_vocab_size": (1, "vocab", True, True),
        "max_len": (1, "positions", True, True),
        "pad_id": (0, None, True, True),
        "bos_id": (0, None, True, True),
    },
    "G2POptim": {
        "epochs": (1, 100_000, True, True),
        "batch_size": (1, 1 << 20, True, True),
        "lr": (0, 10, False, True),
        "warmup": (0, 1, True, True),
        "weight_decay": (0, None, True, True),
        "clip": (0, None, True, True),
        "label_smoothing": (0, 1, True, False),
    },
    "G2PRun": {
        "seed": (0, (1 << 63) - 1, True, True),
        "threads": (1, 4096, True, True),
        "eval_words": (0, None, True, True),
        "beam": (1, 64, True, True),
    },
}
CEILINGS = {"layers": 1024, "vocab": 2_000_000, "positions": 1 << 20, "classes": 100_000, "parameters": 2e9}


def _range_error(where: str, value, rule: tuple) -> str | None:
    lo, hi, lo_in, hi_in = rule
    if isinstance(hi, str):
        name, hi = hi, ceiling(hi, CEILINGS[hi])
    else:
        name = None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value}"
    too_low = lo is not None and (value < lo if lo_in else value <= lo)
    too_high = hi is not None and (value > hi if hi_in else value >= hi)
    if not (too_low or too_high):
        return None

    def num(x) -> str:
        return f"{int(x):,}" if float(x).is_integer() and abs(x) >= 1000 else f"{x:g}"

    lo_s = "" if lo is None else f"{'[' if lo_in else '('}{num(lo)}"
    hi_s = "inf)" if hi is None else f"{num(hi)}{']' if hi_in else ')'}"
    extra = (
        f" (the ceiling MULTIHEAD_MAX_{name.upper()}; raise it in the environment if you mean it)"
        if name and too_high
        else ""
    )
    return f"{where} must be in {lo_s or '(-inf'}, {hi_s}, got {value!r}{extra}"


@cache
def _adapter(cls):
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _allows_bool(hint) -> bool:
    return hint is bool or bool in typing.get_args(hint) or hint is typing.Any


def _type_name(hint) -> str:
    return " or ".join(getattr(t, "__name__", str(t)) for t in (typing.get_args(hint) or (hint,)))


def _format(exc, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        field = f"{where}.{loc}" if where and loc else (where or loc or "config")
        msg = err.get("msg", "invalid value")
        msg = msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg
        msg = msg[len("invalid config: ") :] if msg.startswith("invalid config: ") else msg  # a nested config's own
        got = err.get("input")
        shown = "" if err.get("type") == "value_error" or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{field}: {msg}{shown}" if where or loc else f"{msg}{shown}")
    return "invalid config: " + "; ".join(lines[:5]) + (f"; and {len(lines) - 5} more" if len(lines) > 5 else "")


def from_fields(cls, values, where: str = ""):
    """``cls(**values)`` after checking that ``values`` is a dict of known fields with values of the declared types
    and in :data:`RANGES`; nested dataclass fields are checked the same way. Raises :class:`ConfigError`."""
    from pydantic import ValidationError

    label = where or cls.__name__
    if dataclasses.is_dataclass(values) and isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(
            f"invalid config: {label} must be a table of fields (a JSON object / TOML section), got "
            f"{type(values).__name__} {values!r:.80}"
        )
    values = _migrate(values, getattr(cls, "LEGACY_FIELDS", None))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"invalid config: unknown {label} fields {sorted(map(str, unknown))}; known: {sorted(known)}")
    values = dict(values)
    hints = _hints(cls)
    for name, value in list(values.items()):  # nested configs first, so their errors carry their own path
        sub = hints.get(name)
        if isinstance(sub, type) and dataclasses.is_dataclass(sub) and isinstance(value, dict):
            values[name] = from_fields(sub, value, f"{where}.{name}" if where else name)
        elif isinstance(value, bool) and sub is not None and not _allows_bool(sub):  # lax mode would take True as 1
            raise ConfigError(
                f"invalid config: {where + '.' if where else ''}{name}: expected {_type_name(sub)}, got "
                f"{str(value).lower()}"
            )
    try:
        obj = _adapter(cls).validate_python(values)
    except ValidationError as exc:
        raise ConfigError(_format(exc, where)) from None
    check_ranges(obj, where)
    return obj


def _migrate(values: dict, legacy: dict | None) -> dict:
    """Fields a config class moved into a nested config (``legacy``: old name -> ``"section.name"``), read into it:
    old config.json files and ``--set`` keys keep working. A moved value given beside the section wins over the
    section's (the section holds defaults, the flat key what was asked)."""
    if not legacy or not any(k in legacy for k in values):
        return values
    out = {k: v for k, v in values.items() if k not in legacy}
    for old, value in values.items():
        if old not in legacy:
            continue
        section, name = legacy[old].split(".")
        sub = out.get(section)
        sub = dataclasses.asdict(sub) if dataclasses.is_dataclass(sub) else dict(sub) if isinstance(sub, dict) else {}
        sub[name] = value
        out[section] = sub
    return out


def check_ranges(obj, where: str = "") -> None:
    """Every field of ``obj`` (and of the config classes it derives from) inside its :data:`RANGES`."""
    for klass in type(obj).__mro__:
        for name, rule in RANGES.get(klass.__name__, {}).items():
            value = getattr(obj, name, None)
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            problem = _range_error(f"{where}.{name}" if where else name, value, rule)
            if problem:
                raise ConfigError(f"invalid config: {problem}")


def check_rules(rules: list[tuple[str, bool, str]]) -> None:
    """``rules`` = ``(field, holds, what it must be)``; one :class:`ConfigError` naming every rule that fails."""
    bad = [f"{name} must be {want}" for name, ok, want in rules if not ok]
    if bad:
        raise ConfigError("invalid config: " + "; ".join(bad))


def check_size(parameters: int, what: str = "the model") -> None:
    """Refuse to build more than ``MULTIHEAD_MAX_PARAMETERS`` parameters (a hostile or mistyped config would
    otherwise exhaust memory before any other check runs)."""
    limit = ceiling("parameters", CEILINGS["parameters"])
    if parameters > limit:
        raise ConfigError(
            f"{what} would have about {parameters:,} parameters, over the ceiling of {limit:,.0f} "
            "(MULTIHEAD_MAX_PARAMETERS); check the config's sizes, or raise the ceiling in the "
            "environment if you mean it"
        )


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested config dict -> ``{"section.key": value}`` (empty dicts kept as values)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat: dict) -> dict:
    """The inverse of :func:`flatten`."""
    out: dict = {}
    for key, value in flat.items():
        d = out
        *parents, last = key.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
    return out


__all__ = [
    "CEILINGS",
    "ConfigError",
    "RANGES",
    "ceiling",
    "check_ranges",
    "check_size",
    "flatten",
    "from_fields",
    "unflatten",
]
