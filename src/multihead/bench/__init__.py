"""Benchmarks: one harness that runs every case in a fresh process and writes JSON (see :mod:`.harness`)."""
