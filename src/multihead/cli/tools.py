"""``multihead demo``, ``backends`` and ``bench``: the tour, the backend table, the benchmarks."""

from __future__ import annotations

from pathlib import Path

from .args import _count, _fractions, _threads, _ints, _seconds, _words


def cmd_demo(args) -> int:
    from .._io import folder_lock
    from ..demo import run_demo, walkthrough

    with folder_lock(args.out):  # every file the tour writes is listed in its folders' manifests: a rerun replaces
        if args.walkthrough_only:  # them, and never a file of the user's
            walkthrough(Path(args.out), seed=args.seed)
        else:
            run_demo(Path(args.out), seed=args.seed, limit=args.limit, epochs=args.epochs, threads=args.threads)
    return 0


def cmd_backends(args) -> int:
    from ..attention import list_backends

    for name, b in sorted(list_backends().items(), key=lambda kv: -kv[1].priority):
        c = b.capabilities
        why = b.available()
        print(
            f"{name:<17} priority {b.priority:>3}  weights={c.returns_weights} dropout={c.supports_dropout} "
            f"gqa={c.supports_gqa} exact={c.exact} patterns={','.join(c.patterns) or '-'}"
            f"{' (only)' if c.requires_pattern else ''}  {b.description}" + (f"  [unavailable: {why}]" if why else "")
        )
    import torch

    from ..attention.registry import CallInfo, resolve

    picks = []
    for what, pattern in (("a sliding window", "window"), ("BigBird blocks", "block"), ("a dense call", None)):
        per_device = []
        for device in ("cpu", "cuda"):
            call = CallInfo(
                device=device,
                dtype=torch.float32,
                need_weights=False,
                dropout_p=0.0,
                gqa=False,
                mask_parts=frozenset({pattern} if pattern else ()),
                pattern=pattern,
            )
            try:
                per_device.append(f"{resolve('auto', call).name} on {device}")
            except RuntimeError:
                per_device.append(f"nothing on {device}")
        picks.append(f"{what}: {', '.join(per_device)}")
    print("auto picks (mh.explain_choice says why for a real call): " + "; ".join(picks))
    return 0


def cmd_bench(args) -> int:
    from .._io import file_lock
    from ..bench import check_device_flags, suite as bench_suite

    check_device_flags(args.suite, args.device, args.dtype)
    suite = bench_suite(args.suite)
    known = getattr(suite, "MODES", None)
    unknown = [m for m in args.modes or () if known is not None and m not in known]
    if args.modes is not None and (unknown or known is None):
        raise ValueError(
            f"bench {args.suite} has no modes {unknown}; choose from {', '.join(known)}"
            if known
            else f"bench {args.suite} takes no --modes"
        )
    out = Path(args.out) if args.out else suite.default_out()
    if out.is_dir():  # checked before the benchmark runs, not after
        raise ValueError(
            f"--out {str(out)!r} is a folder; bench writes a JSON file: give a path such as "
            f"{out / (args.suite + '.json')}"
        )
    written = (out, out.with_suffix(".png"), out.with_suffix(".svg"), out.with_suffix(".md"))
    taken = [p for p in written if p.exists() or p.is_symlink()]
    if taken and not args.overwrite and not (getattr(args, "resume", False) and out.is_file()):
        # bench writes these: a file already there is never replaced unasked (--resume goes on with its JSON)
        raise ValueError(
            f"--out {str(out)!r} would replace {', '.join(str(p) for p in taken)}, which exist already; pass "
            "--overwrite to replace them, or choose another path"
        )
    with file_lock(out):  # two runs writing one JSON (a resume beside a run) would lose each other's samples
        payload = suite.from_args(args, out)
    print(suite.format_table(payload))
    png = out.with_suffix(".png")
    print(f"wrote {out}" + (f" and {png}" if png.exists() else ""))
    return 0


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    d = sub.add_parser(
        "demo", help="the tour of the whole product on built-in data and the bundled models (what `make demo` runs)"
    )
    d.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--limit", type=_count, default=None, help="examples per split (a quick smoke run)")
    d.add_argument("--epochs", type=_count, default=None, help="override the training epochs")
    d.add_argument("--walkthrough-only", action="store_true", help="skip training; only the attention walk-through")
    d.add_argument(
        "--threads", type=_threads, default=None, help="torch threads (default: torch's choice; 1 on a busy machine)"
    )
    d.set_defaults(fn=cmd_demo)

    b = sub.add_parser("backends", help="list the registered attention backends and their capabilities")
    b.set_defaults(fn=cmd_backends)
    _parser_bench(sub)


def _parser_bench(sub) -> None:
    from ..bench import SUITES

    bench = sub.add_parser("bench", help="benchmarks: ours and peers in one run, JSON + PNG")
    bench.add_argument("suite", choices=list(SUITES), help="which benchmark")
    bench.add_argument("--lengths", type=_ints, default=None, help="comma-separated sequence lengths")
    bench.add_argument("--modes", type=_words, default=None, help="forward,train")
    bench.add_argument(
        "--impls", type=_words, default=None, help="comma-separated implementations (kv: policies and presses)"
    )
    _bench_kv_flags(bench)
    _bench_decode_flags(bench)
    bench.add_argument("--keys", type=_count, default=1, help="kv: needles in each prompt, one asked for (1)")
    bench.add_argument(
        "--fractions", type=_fractions, default=None, help="kv: kept fractions of the prompt's keys (0.125,0.25,0.5)"
    )
    bench.add_argument("--threads", type=_threads, default=None, help="torch threads (default: what torch picks)")
    bench.add_argument("--device", default="cpu", help="cpu | cuda (attention, long, decode, kernels)")
    bench.add_argument("--dtype", default="fp32", help="fp32 | bf16 | fp16 (attention, long, decode, kernels)")
    bench.add_argument("--min-time", type=_seconds, default=1.0, help="seconds of timed repeats per case")
    bench.add_argument("--out", default=None, help="JSON path (default bench/results/<suite>-<time>.json)")
    bench.add_argument(
        "--overwrite", action="store_true", help="replace the JSON file and its figures where --out names existing ones"
    )
    bench.add_argument(
        "--demos", default=None, help="lens: a TransformerLens checkout's demos folder (its own notebooks, run by both)"
    )
    bench.add_argument("--runs", default="runs/lra", help="lra: folder for the training runs")
    bench.add_argument("--max-len", type=_count, default=1024, help="lra: tokens per review")
    bench.add_argument("--epochs", type=_count, default=3, help="lra: epochs per variant")
    bench.add_argument("--limit", type=_count, default=None, help="lra: examples per split")
    bench.add_argument("--batches", type=_ints, default=None, help="decode, dinov2: comma-separated batch sizes")
    bench.add_argument(
        "--model",
        default=None,
        help="decode: race the shape of this causal LM run (pretrain clm), or "
        "a pretrained LM (smollm2, .gguf, HF folder) against HF loading "
        "the same file",
    )
    bench.add_argument(
        "--prefill",
        type=_ints,
        default=None,
        help="decode --model LM: prompt lengths whose forward pass is timed (default 512,4096)",
    )
    bench.add_argument(
        "--context",
        type=_count,
        default=None,
        help="decode --model LM: also decode after this many tokens of held-out text, ours under each KV policy "
        "(default 4096, or the model's positions less the new tokens where it has fewer)",
    )
    bench.add_argument("--kv-budget", type=_count, default=512, help="decode --context: keys kept per head (512)")
    bench.add_argument("--kv-heads", default=None, help="decode --context, kv: kv-heads.json for the head-aware policy")
    bench.add_argument(
        "--clips", type=_count, default=None, help="whisper: spoken sentences compared with HF (default 10)"
    )
    bench.set_defaults(fn=cmd_bench)


def _bench_decode_flags(bench) -> None:
    """``bench decode``'s own flags: a decode-only race, alternated rounds."""
    bench.add_argument("--no-context", action="store_true", help="decode --model LM: no decoding after a context")
    bench.add_argument("--no-prefill", action="store_true", help="decode --model LM: no prefill cases")
    bench.add_argument(
        "--rounds", type=_count, default=None, help="decode: run every case this many times, alternated (1)"
    )


def _bench_kv_flags(bench) -> None:
    """``bench kv``'s own flags: the tasks, samples, protocols and what else a run measures."""
    bench.add_argument(
        "--tasks", type=_words, default=None, help="kv: comma-separated RULER-style tasks (default: every task)"
    )
    bench.add_argument("--n", type=int, default=None, help="kv: samples per task, length and protocol (default 50)")
    bench.add_argument(
        "--protocols", type=_words, default=None, help="kv: context (compress the context, then ask), question (both)"
    )
    bench.add_argument(
        "--evict", default=None, help="kv: prompt (policies evict once, after the prompt: default) or always"
    )
    bench.add_argument(
        "--budget",
        default=None,
        help="kv: how many keys per head a fraction is: kvpress (its own count, the default) or round "
        "(round(fraction x length), the rule of earlier runs; to rerun one)",
    )
    bench.add_argument("--resume", action="store_true", help="kv: go on with the samples --out's JSON already holds")
    bench.add_argument(
        "--join",
        type=_words,
        default=None,
        help="kv: join these runs of one grid (comma-separated JSON files, split by --tasks, --lengths or "
        "--protocols) into --out; no model is read",
    )
    bench.add_argument(
        "--decode",
        type=_count,
        default=None,
        help="kv: also a budget kept while decoding: this many tokens read one at a time after the shortest length",
    )
    bench.add_argument(
        "--memory", action="store_true", help="kv: also each method's peak memory, one fresh process per method"
    )
