"""Registered attention backends. Importing this package registers them all."""
from . import memory_efficient, reference, sdpa  # noqa: F401
