"""``multihead findings NAME MODEL``: head findings of 2025-2026 measured on a model (the paper's claim beside the
number, a figure, JSON and a page)."""

from __future__ import annotations

import shutil

from .args import LazyChoices, Route, _count, _counts, _threads


def cmd_findings(args) -> int | Route:
    from ..interpret.findings import check_name

    check_name(args.finding)  # an unknown finding is refused before the model is named a route
    return Route("findings", args.model)


def findings_lm(args) -> int:
    """A finding on a pretrained causal LM: held-out IMDB text at the lengths asked (the sink findings) or the
    built-in few-shot tasks (fv-heads); refused before anything is written where a length is past the model's
    positions."""
    from tqdm import tqdm

    from .._io import check_target
    from ..bench.decode import lm_layout
    from ..data.lm_text import held_out_rows
    from ..interpret import findings as F
    from ..interpret.kv.heads import needles_for
    from .lm import _load_lm

    finding = F.check_name(args.finding)
    F.check_kind(finding, "lm", args.model)
    if args.out:
        check_target(args.out, "findings", overwrite=args.overwrite, sources=(args.model,))
    options = _options(args, finding.name)
    _, positions = lm_layout(args.model)  # from the config or the file's header: no weight read yet
    longest = max(finding.lengths(options), default=0)
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
            F.Text(
                lambda n: held_out_rows(p, rows=args.texts, length=n),
                lambda t: p.encode(t, special=False),
                lambda n, count: needles_for(p, length=n, count=count),
            ),
            options,
            bar,
        )
    return _publish(
        args,
        payload,
        "built-in few-shot tasks" if finding.name == "fv-heads" else "imdb test split, reviews concatenated",
    )


def findings_whisper(args) -> int:
    """A finding on a Whisper model: non-speech audio made here and sentences spoken by espeak-ng."""
    from tqdm import tqdm

    from ..interpret import findings as F
    from ..interpret.findings.hallucination import decoder_heads

    if args.top < 1:
        raise ValueError("--top: mask at least one head")
    _at_most("--clips", args.clips, MAX_CLIPS, f"{MAX_CLIPS} x 7 kinds of 8 s clips are transcribed in one batch")
    _at_most("--sentences", args.sentences, MAX_SENTENCES, "the sentences are transcribed in one batch")
    if shutil.which("espeak-ng") is None:
        raise ValueError("hallucination-heads speaks its test sentences with espeak-ng: apt-get install espeak-ng")
    finding, w = _loaded(args, "whisper")
    heads = decoder_heads(w.model)
    if args.top > len(heads):
        raise ValueError(f"--top {args.top}: the model has {len(heads)} decoder self-attention heads")
    options = {"clips": args.clips, "sentences": args.sentences, "top": args.top, "heads": len(heads)}
    options["layers"] = len({i for i, _ in heads})
    with tqdm(total=finding.steps(options), desc=f"findings {finding.name}", disable=args.no_progress) as bar:
        payload = F.run(finding.name, w, None, options, bar)
    return _publish(args, payload, "non-speech audio made with numpy; IMDB sentences spoken by espeak-ng")


def findings_dinov2(args) -> int:
    """A finding on a DINOv2 ViT: scikit-image's sample photographs."""
    from ..interpret import findings as F

    finding, d = _loaded(args, "dinov2")
    payload = F.run(finding.name, d, None, {"neurons": args.neurons}, None)
    return _publish(
        args,
        payload,
        "scikit-image's sample photographs (chelsea, astronaut, coffee, rocket), object boxes drawn by hand",
    )


def _loaded(args, kind: str):
    """The finding asked for and the model of ``kind`` it measures, loaded once the finding, its kind and the output
    folder are checked."""
    from .._io import check_target
    from .._proc import set_threads
    from ..interpret import findings as F
    from ..loading import load

    finding = F.check_name(args.finding)
    F.check_kind(finding, kind, args.model)
    if args.out:
        check_target(args.out, "findings", overwrite=args.overwrite, sources=(args.model,))
    set_threads(args.threads)
    return finding, load(args.model, progress=True).detail


def _publish(args, payload: dict, data: str) -> int:
    """The verdict printed and, with ``--out``, the finding's JSON, figure and page written."""
    from ..interpret import findings as F

    payload["model"], payload["data"] = str(args.model), data
    F.report(payload, args.out, overwrite=args.overwrite, sources=(args.model,))
    return 0


MAX_PROMPTS = 200  # few-shot prompts per task, scoring or held out
MAX_CLIPS, MAX_SENTENCES = 10, 50  # hallucination-heads: per kind and half; per half (each half is one batch)


def _at_most(flag: str, value: int, limit: int, why: str) -> None:
    if value > limit:
        raise ValueError(f"{flag} {value}: at most {limit} ({why})")


def _options(args, name: str) -> dict:
    """The options a finding reads, checked before the model loads."""
    from ..data.icl_tasks import TASKS

    options = {"lengths": sorted(set(args.lengths or [256, 1024, 4096])), "length": args.length, "texts": args.texts}
    options["neurons"], options["spike"], options["needles"] = args.neurons, args.spike, args.needles
    if args.needles < 0:
        raise ValueError(f"--needles is a number of needle prompts (0: none), got {args.needles}")
    if len(options["lengths"]) < 2 and name == "sink-length":
        raise ValueError("sink-length compares lengths: pass at least two with --lengths (e.g. 256,1024,4096)")
    if name == "fv-heads":
        tasks = args.tasks.split(",") if args.tasks else list(TASKS)
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"no few-shot task is called {', '.join(unknown)}; choose from {', '.join(TASKS)}")
        fewest = min(tasks, key=lambda t: len(TASKS[t]))
        _at_most(
            "--shots",
            args.shots,
            len(TASKS[fewest]) - 1,
            f"demonstrations drawn from the {len(TASKS[fewest])} pairs of {fewest}",
        )
        if args.shots < 2:
            raise ValueError("--shots: a task is shown by at least 2 demonstrations")
        _at_most("--prompts", args.prompts, MAX_PROMPTS, "each scores every head once")
        _at_most("--held-out", args.held_out, MAX_PROMPTS, "they are read in one batch per task and ablation")
        options.update(
            tasks=tasks, shots=args.shots, prompts=args.prompts, held_out=args.held_out, ablate=args.ablate or [9, 27]
        )
    return options


def register(sub) -> None:
    fi = sub.add_parser(
        "findings",
        help="head findings of 2025-2026 measured on a model: sink strength vs context length (sink-length), "
        "spike / sink / entropy valley per layer (sink-valley), the massive activation's origin and super neurons "
        "(massive-origin), function-vector heads vs induction heads (fv-heads), Whisper's hallucinating heads "
        "(hallucination-heads), DINOv2's test-time register (registers)",
    )
    fi.add_argument(
        "finding",
        choices=LazyChoices("multihead.interpret.findings", "FINDINGS"),
        metavar="FINDING",
        help="which finding: %(choices)s",
    )
    fi.add_argument(
        "model", help="the model the finding measures: a causal LM (smollm2, a .gguf file, an HF folder), whisper"
    )
    fi.add_argument(
        "--lengths", type=_counts, default=None, help="sink-length: context lengths compared (256,1024,4096)"
    )
    fi.add_argument("--length", type=_count, default=1024, help="sink-valley, massive-origin: tokens per text")
    fi.add_argument(
        "--spike",
        choices=("first", "largest"),
        default="first",
        help="massive-origin: explain the first massive activation, or the largest (a later one, within 10x of "
        "the peak)",
    )
    fi.add_argument(
        "--needles",
        type=int,
        default=5,
        help="sink-length: needle prompts retrieved with and without the sink (0: none)",
    )
    fi.add_argument("--texts", type=_count, default=4, help="held-out texts averaged at each length")
    fi.add_argument(
        "--neurons", type=_count, default=5, help="massive-origin: the super neurons edited; registers: neurons moved"
    )
    fi.add_argument("--tasks", default=None, help="fv-heads: few-shot tasks, comma-separated (default: every one)")
    fi.add_argument("--shots", type=_count, default=10, help="fv-heads: demonstrations per prompt")
    fi.add_argument("--prompts", type=_count, default=10, help="fv-heads: prompts per task scoring the heads")
    fi.add_argument("--held-out", type=_count, default=25, help="fv-heads: prompts per task measuring accuracy")
    fi.add_argument("--ablate", type=_counts, default=None, help="fv-heads: how many top heads ablated (9,27)")
    fi.add_argument("--clips", type=_count, default=2, help="hallucination-heads: non-speech clips per kind and half")
    fi.add_argument("--sentences", type=_count, default=10, help="hallucination-heads: spoken sentences per half")
    fi.add_argument("--top", type=int, default=3, help="hallucination-heads: heads masked together")
    fi.add_argument("--threads", type=_threads, default=None)
    fi.add_argument("--out", default=None, help="write NAME.json, NAME.png and README.md here")
    fi.add_argument("--overwrite", action="store_true")
    fi.add_argument("--no-progress", action="store_true")
    fi.set_defaults(fn=cmd_findings)
