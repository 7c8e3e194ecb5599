"""The package version, in one place: the package root, the command line and the wheel's metadata read it."""

__version__ = "0.1.0"
