"""The ``multihead`` command. It parses arguments and calls library functions; everything is callable from Python."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _words(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def cmd_demo(args) -> int:
    from .demo import walkthrough

    walkthrough(Path(args.out), seed=args.seed)
    return 0


def cmd_backends(args) -> int:
    from .attention import list_backends

    for name, b in sorted(list_backends().items(), key=lambda kv: -kv[1].priority):
        c = b.capabilities
        print(f"{name:<12} priority {b.priority:>3}  weights={c.returns_weights} masks={c.supports_mask} "
              f"dropout={c.supports_dropout} gqa={c.supports_gqa} exact={c.exact}  {b.description}")
    return 0


def cmd_bench(args) -> int:
    if args.suite == "attention":
        from .bench import attention as suite

        if args.impls:
            known = suite.implementations()
            bad = [i for i in args.impls if i not in known]
            if bad:
                print(f"error: unknown implementation(s) {bad}; choose from {known}", file=sys.stderr)
                return 2
        out = Path(args.out) if args.out else suite.default_out()
        payload = suite.run(args.lengths, args.modes, args.impls, threads=args.threads, out=out,
                            min_time=args.min_time)
        print(suite.format_table(payload))
        print(f"wrote {out} and {out.with_suffix('.png')}")
        return 0
    print(f"error: unknown bench suite {args.suite!r}; choose: attention", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="multihead", description="Multi-head attention: train, inspect, prune, run fast.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the tutorial's walk-through, run for real")
    d.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(fn=cmd_demo)

    b = sub.add_parser("backends", help="list the registered attention backends and their capabilities")
    b.set_defaults(fn=cmd_backends)

    bench = sub.add_parser("bench", help="benchmarks: ours and peers in one run, JSON + PNG")
    bench.add_argument("suite", choices=["attention"], help="which benchmark")
    bench.add_argument("--lengths", type=_ints, default=None, help="comma-separated sequence lengths")
    bench.add_argument("--modes", type=_words, default=None, help="forward,train")
    bench.add_argument("--impls", type=_words, default=None, help="comma-separated implementations")
    bench.add_argument("--threads", type=int, default=None, help="torch threads (default: what torch picks)")
    bench.add_argument("--min-time", type=float, default=1.0, help="seconds of timed repeats per case")
    bench.add_argument("--out", default=None, help="JSON path (default bench/results/attention-<time>.json)")
    bench.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
