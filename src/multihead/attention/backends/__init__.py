"""Registered attention backends. Importing this package registers them all."""
from . import reference, sdpa  # noqa: F401
