"""Registered attention backends. Importing this package registers them all."""

from . import flex, linear, memory_efficient, reference, sdpa, sparse  # noqa: F401
