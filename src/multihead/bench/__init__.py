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
    "kv": "multihead.bench.kv",
    "stats": "multihead.bench.stats",
    "kernels": "multihead.bench.kernels",
    "patch": "multihead.bench.patch",
    "whisper": "multihead.bench.whisper",
    "dinov2": "multihead.bench.dinov2",
    "peers": "multihead.bench.peers",
    "lens": "multihead.bench.lens",
    "loop": "multihead.bench.loop",
    "observe": "multihead.bench.observe",
    "page": "multihead.bench.page",
    "precision": "multihead.bench.precision",
}
# the suites that take ``--device cuda`` / ``--dtype bf16|fp16`` (the others measure CPU fp32 runs)
ON_DEVICE = ("attention", "long", "decode", "kernels")


def check_device_flags(name: str, device: str, dtype: str) -> None:
    """Refuse ``--device``/``--dtype`` a suite does not take, or a device this machine lacks, before anything runs."""
    from .harness import check_target

    if (device, dtype) != ("cpu", "fp32") and name not in ON_DEVICE:
        raise ValueError(f"bench {name} measures CPU fp32 only; --device/--dtype apply to {', '.join(ON_DEVICE)}")
    check_target(device, dtype)


def suite(name: str):
    """The module of bench suite ``name`` (imported on demand: each suite pulls its own peers)."""
    import importlib

    if name not in SUITES:
        raise ValueError(f"unknown bench suite {name!r}; choose: {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name])
