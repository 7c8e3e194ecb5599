"""Benchmarks: one harness that runs every case in a fresh process and writes JSON (see :mod:`.harness`)."""

# The suites of ``multihead bench``: name -> module. Each module has the same protocol: ``from_args(args, out) ->
# payload`` (runs the suite, writes its JSON to ``out``), ``format_table(payload) -> str``, ``default_out() -> Path``.
SUITES = {
    "attention": "multihead.bench.attention",
    "train": "multihead.bench.train",
    "pretrained": "multihead.bench.pretrained",
    "long": "multihead.bench.long",
    "lra": "multihead.bench.lra",
    "decode": "multihead.bench.decode",
    "stats": "multihead.bench.stats",
}


def suite(name: str):
    """The module of bench suite ``name`` (imported on demand: each suite pulls its own peers)."""
    import importlib

    if name not in SUITES:
        raise ValueError(f"unknown bench suite {name!r}; choose: {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name])
