"""``multihead generate``, ``sinks`` and ``induction``: causal language models (streaming generation, attention sinks
and the StreamingLLM cache, induction heads).
"""

from __future__ import annotations

from pathlib import Path

from .args import _count, _nonneg, _number


def _is_lm(source: str, verb: str) -> bool:
    """Whether ``source`` is a pretrained LM (anything else goes to the pretraining run's loader, whose messages
    name what a run folder needs)."""
    from ..loading import route
    from ..pretrained import FAMILIES, SourceError, names

    entry = names.short_name(source)
    if entry is not None:  # a bundled LM whose package may be missing: its loader names the install line
        return FAMILIES[entry.family].kind == "lm"
    try:
        return route(source, verb) == "lm"
    except SourceError:
        return False


def _prompt_ids(run, prompt: str, max_new: int):
    """``(tokenizer, start id, prompt ids)`` for a pretraining run, checked to leave room for ``max_new`` tokens."""
    from ..data.tokenizer import SEP

    tok, positions = run.tokenizer, run.config.causal.max_len
    sep = tok.token_to_id(SEP)
    ids = [sep, *tok.encode(prompt, add_special_tokens=False).ids]  # [SEP] = the start of a new text
    if len(ids) >= positions:  # no room for even one new token: a shorter --max-new cannot help
        raise ValueError(
            f"the prompt is {len(ids)} tokens with the start marker, and the model has {positions} "
            f"positions: shorten the prompt to at most {positions - 2} tokens"
        )
    if len(ids) + max_new > positions:
        raise ValueError(
            f"the prompt ({len(ids)} tokens with the start marker) plus --max-new {max_new} exceeds "
            f"the model's {positions} positions; use --max-new {positions - len(ids)} or less, or a "
            "shorter prompt"
        )
    return tok, sep, ids


def cmd_generate(args) -> int:
    """``multihead generate RUN "prompt"``: continue a prompt with a causal LM run, streaming tokens (KV cache)."""
    import sys

    from .._proc import set_threads
    from ..data.batching import as_batch

    from ..models.generation import generate
    from ..train.pretrain import load_pretrain_run
    from . import pretrained_lm

    if _is_lm(args.run, "generate"):
        return pretrained_lm.generate(args)
    if args.chat:
        raise ValueError("--chat applies a pretrained LM's chat template; a pretraining run has none")
    run = load_pretrain_run(args.run)
    if run.config.objective.name != "clm":
        raise ValueError(
            f"{args.run} is a {run.config.objective.name} run; generation needs a causal LM: "
            "multihead pretrain --objective clm"
        )
    tok, sep, ids = _prompt_ids(run, args.prompt, args.max_new)
    set_threads(args.threads)
    out = list(ids)
    shown = [tok.decode(out[1:])]
    sys.stdout.write(shown[0])
    sys.stdout.flush()

    def stream(tokens, alive) -> None:
        if not bool(alive[0]):
            return
        out.append(int(tokens[0]))
        text = tok.decode(out[1:])
        if args.stream:
            sys.stdout.write(text[len(shown[0]) :] if text.startswith(shown[0]) else "\n" + text)
            sys.stdout.flush()
        shown[0] = text

    options = dict(
        strategy="sample" if args.sample else "greedy",
        max_new_tokens=args.max_new,
        stop_tokens=(sep,),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    generate(run.model, as_batch(ids), None, streamer=stream, **options)
    if not args.stream:
        sys.stdout.write(shown[0][len(tok.decode(ids[1:])) :])
    sys.stdout.write("\n")
    return 0


def cmd_sinks(args) -> int:
    """``multihead sinks RUN``: StreamingLLM's three caches on held-out text longer than the trained rows."""
    from .._proc import set_threads

    from .._io import check_target
    from ..interpret import streaming as S
    from ..train.pretrain import held_out_rows, load_pretrain_run
    from . import pretrained_lm

    if _is_lm(args.run, "sinks"):
        return pretrained_lm.sinks(args)
    if args.out:
        check_target(args.out, "sinks", overwrite=args.overwrite, sources=(args.run,))
    run = load_pretrain_run(args.run)
    if run.config.objective.name != "clm" or run.config.causal.positional != "rope":
        raise ValueError(
            f"{args.run}: the cache comparison needs a causal LM with rotary positions (positions within "
            "a window cache); train one with: multihead pretrain --objective clm --set "
            'causal.positional="rope"'
        )
    trained = run.config.causal.max_len
    length = args.length or 4 * trained
    window = args.window or trained // 2
    band = args.band or trained // 2
    if length < 2 * band or length <= window + args.sinks:  # a curve needs two bands and text past the cache
        raise ValueError(
            f"--length {length} is too short to compare the caches: it must exceed the window plus the "
            f"sinks ({window} + {args.sinks}) and hold two bands of {band} tokens; pass a larger "
            f"--length (default 4x the trained rows: {4 * trained})"
        )
    set_threads(args.threads)
    rows = held_out_rows(run, length)[: args.texts]
    result = S.compare(run.model, rows.long(), window=window, sinks=args.sinks, band=band)
    result["model"] = str(args.run)
    S.report(result, args.out, overwrite=args.overwrite, sources=(args.run,))
    return 0


def cmd_induction(args) -> int:
    """``multihead induction``: the phase change of Olsson et al. in a 2-layer attention-only model."""
    from .._proc import set_threads

    from .._io import Publish, atomic_write_json, check_target
    from ..interpret import induction as I

    if args.model:
        from . import pretrained_lm

        return pretrained_lm.induction(args)
    check_target(args.out, "induction", overwrite=args.overwrite)
    config = I.ToyConfig(steps=args.steps, seed=args.seed, num_heads=args.heads, half=args.half, vocab=args.vocab)
    set_threads(args.threads)
    r = I.train_toy(config, progress=not args.no_progress)
    r.pop("model")
    best = max(((l, h, v) for l, row in enumerate(r["prefix_matching"]) for h, v in enumerate(row)), key=lambda t: t[2])
    with Publish(args.out, "induction", overwrite=args.overwrite) as folder:
        atomic_write_json(folder / "induction.json", r)
        I.plot_toy(r, folder / "induction.png")
    print(I.format_scores({**r, "half": config.half}))
    print(
        f"phase change (repeated-half loss < half the first half's) at step {r['phase_change_step']}; best head "
        f"L{best[0]}H{best[1]} prefix matching {best[2]:.2f}"
    )
    print(f"wrote {Path(args.out) / 'induction.json'} and induction.png")
    return 0


def _parser_generate(sub) -> None:
    ge = sub.add_parser(
        "generate",
        help="continue a prompt with a causal LM run (multihead pretrain --objective "
        "clm), streaming tokens; KV-cached decoding",
    )
    ge.add_argument(
        "run",
        help="pretraining run folder (objective clm), or a pretrained LM: smollm2, a .gguf file, "
        "an HF Llama-family or GPT-2 folder",
    )
    ge.add_argument("--chat", action="store_true", help="pretrained LMs: wrap the prompt in the model's chat template")
    ge.add_argument("prompt", nargs="?", default="", help="text to continue (default: start a new text)")
    ge.add_argument("--max-new", type=_count, default=50, help="new tokens at most (stops early at the end of a text)")
    ge.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    ge.add_argument(
        "--temperature",
        type=_number(float, 1e-3, 1e3, "a temperature in [0.001, 1000]"),
        default=1.0,
        help="sampling temperature",
    )
    ge.add_argument("--top-k", type=_nonneg, default=0, help="sample from the k most likely tokens (0: all)")
    ge.add_argument(
        "--top-p",
        type=_number(float, 1e-6, 1.0, "a probability in (0, 1]"),
        default=1.0,
        help="nucleus sampling: the smallest set reaching p",
    )
    ge.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    ge.add_argument("--threads", type=_count, default=None, help="torch threads")
    ge.add_argument("--no-stream", dest="stream", action="store_false", help="print the text once, at the end")
    ge.set_defaults(fn=cmd_generate)


def _parser_sinks(sub) -> None:
    sk = sub.add_parser(
        "sinks",
        help="attention sinks: perplexity on long held-out text with a full, a sliding-"
        "window and a window + sinks cache (StreamingLLM), for a rotary causal LM run",
    )
    sk.add_argument(
        "run",
        help="pretraining run folder (objective clm, positional rope), or a pretrained LM "
        "(smollm2, .gguf, HF folder): held-out IMDB reviews concatenated",
    )
    sk.add_argument("--length", type=_count, default=None, help="tokens per text (default 4x the trained row length)")
    sk.add_argument("--window", type=_count, default=None, help="window of recent tokens (default half a trained row)")
    sk.add_argument("--sinks", type=_nonneg, default=4, help="first tokens kept by the sinks cache (paper: 4)")
    sk.add_argument("--band", type=_count, default=None, help="positions per perplexity band (default half a row)")
    sk.add_argument("--texts", type=_count, default=8, help="held-out streams averaged")
    sk.add_argument("--threads", type=_count, default=None)
    sk.add_argument("--out", default=None, help="write sinks.json and sinks.png here")
    sk.add_argument("--overwrite", action="store_true")
    sk.set_defaults(fn=cmd_sinks)


def _parser_induction(sub) -> None:
    from ..interpret.induction import ToyConfig as ToyDefaults

    ind = sub.add_parser(
        "induction",
        help="induction heads form: a 2-layer attention-only model trained on "
        "repeated random tokens (loss curves, prefix-matching scores, PNG)",
    )
    ind.add_argument("--out", required=True, help="folder for induction.json and induction.png")
    ind.add_argument("--steps", type=_count, default=ToyDefaults.steps, help="training steps")
    ind.add_argument("--heads", type=_count, default=ToyDefaults.num_heads, help="heads per layer")
    ind.add_argument(
        "--half",
        type=_number(int, 1, 1024, "an integer in [1, 1024]"),
        default=ToyDefaults.half,
        help="random tokens before the repeat",
    )
    ind.add_argument(
        "--vocab",
        type=_number(int, 2, 65536, "an integer in [2, 65536]"),
        default=ToyDefaults.vocab,
        help="token ids the random tokens are drawn from (small: repeats inside a half blur the score)",
    )
    ind.add_argument("--seed", type=int, default=0)
    ind.add_argument(
        "--model",
        default=None,
        help="score a pretrained LM's heads instead of training the toy model "
        "(smollm2, a .gguf file, an HF folder), with the ablation check",
    )
    ind.add_argument("--batch", type=_count, default=8, help="--model: repeated-token sequences scored")
    ind.add_argument("--ablate", type=_count, default=10, help="--model: top induction heads masked in the check")
    ind.add_argument("--threads", type=_count, default=None)
    ind.add_argument("--overwrite", action="store_true")
    ind.add_argument("--no-progress", action="store_true")
    ind.set_defaults(fn=cmd_induction)


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    _parser_generate(sub)
    _parser_sinks(sub)
    _parser_induction(sub)
