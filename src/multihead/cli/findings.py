"""``multihead findings NAME MODEL``: head findings of 2025-2026 measured on a model (the paper's claim beside the
number, a figure, JSON and a page)."""

from __future__ import annotations

from .args import LazyChoices, Route, _count, _counts, _threads


def cmd_findings(args) -> int | Route:
    from ..interpret.findings import check_name

    check_name(args.finding)  # an unknown finding is refused before the model is named a route
    return Route("findings", args.model)


def findings_lm(args) -> int:
    """A sink finding on a pretrained causal LM: held-out IMDB text at the lengths asked; refused before anything is
    written where a length is past the model's positions."""
    from tqdm import tqdm

    from .._io import check_target
    from ..bench.decode import lm_layout
    from ..data.lm_text import held_out_rows
    from ..interpret import findings as F
    from .lm import _load_lm

    finding = F.check_name(args.finding)
    if args.out:
        check_target(args.out, "findings", overwrite=args.overwrite, sources=(args.model,))
    options = {"lengths": sorted(set(args.lengths or [256, 1024, 4096])), "length": args.length, "texts": args.texts}
    options["neurons"] = args.neurons
    if len(options["lengths"]) < 2 and finding.name == "sink-length":
        raise ValueError("sink-length compares lengths: pass at least two with --lengths (e.g. 256,1024,4096)")
    _, positions = lm_layout(args.model)  # from the config or the file's header: no weight read yet
    longest = max(finding.lengths(options))
    if longest > positions:
        raise ValueError(
            f"{args.model} has {positions:,} positions and the longest text asked for is {longest:,} tokens: pass "
            f"lengths of at most {positions:,}"
        )
    p = _load_lm(args.model, args.threads)
    with tqdm(total=finding.steps(options), desc=f"findings {finding.name}", disable=args.no_progress) as bar:
        payload = F.run(
            finding.name,
            p.model,
            lambda n: held_out_rows(p, rows=args.texts, length=n),
            options,
            bar,
        )
    payload["model"] = str(args.model)
    payload["data"] = "imdb test split, reviews concatenated"
    F.report(payload, args.out, overwrite=args.overwrite, sources=(args.model,))
    return 0


def register(sub) -> None:
    fi = sub.add_parser(
        "findings",
        help="head findings of 2025-2026 measured on a causal LM: sink strength vs context length (sink-length), "
        "spike / sink / entropy valley per layer (sink-valley), the massive activation's origin and super neurons "
        "(massive-origin)",
    )
    fi.add_argument(
        "finding",
        choices=LazyChoices("multihead.interpret.findings", "FINDINGS"),
        metavar="FINDING",
        help="which finding: %(choices)s",
    )
    fi.add_argument("model", help="a pretrained causal LM (smollm2, a .gguf file, an HF folder)")
    fi.add_argument(
        "--lengths", type=_counts, default=None, help="sink-length: context lengths compared (256,1024,4096)"
    )
    fi.add_argument("--length", type=_count, default=1024, help="sink-valley, massive-origin: tokens per text")
    fi.add_argument("--texts", type=_count, default=4, help="held-out texts averaged at each length")
    fi.add_argument("--neurons", type=_count, default=5, help="massive-origin: the super neurons edited")
    fi.add_argument("--threads", type=_threads, default=None)
    fi.add_argument("--out", default=None, help="write NAME.json, NAME.png and README.md here")
    fi.add_argument("--overwrite", action="store_true")
    fi.add_argument("--no-progress", action="store_true")
    fi.set_defaults(fn=cmd_findings)
