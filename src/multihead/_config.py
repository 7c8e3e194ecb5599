"""Dataclass configs from plain dicts (JSON, TOML), refusing unknown fields with the list of known ones."""
from __future__ import annotations

from dataclasses import fields


def from_fields(cls, values: dict):
    """``cls(**values)`` after checking every key is a field of ``cls``."""
    known = {f.name for f in fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}; known: {sorted(known)}")
    return cls(**values)
