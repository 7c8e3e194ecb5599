"""``multihead generate``, ``sinks`` and ``induction``: causal language models (streaming generation, attention sinks
and the StreamingLLM cache, induction heads), on ``multihead pretrain --objective clm`` runs and on pretrained LMs
(smollm2, a .gguf file, an HF folder: the ``*_lm`` functions, which ``heads``, ``importance``, ``prune`` and
``export`` also call for a pretrained LM).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .args import MAX_NEEDLES, LazyChoices, _count, _counts, _names, _threads, _nonneg, _number, Route, say_attached


def _decoding(args, stop_tokens) -> dict:
    """``generate``'s decoding options from the command line (greedy, or sampling with its knobs)."""
    return dict(
        strategy="sample" if args.sample else "greedy",
        max_new_tokens=args.max_new,
        stop_tokens=stop_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


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


def cmd_generate(args) -> int | Route:
    return Route("generate", args.run)


def generate_run(args) -> int:
    """``multihead generate RUN "prompt"``: continue a prompt with a causal LM run, streaming tokens (KV cache)."""
    import sys

    from .._proc import set_threads
    from ..data.batching import as_batch

    from ..models.generation import generate
    from ..train.pretrain import load_pretrain_run

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

    options = _decoding(args, (sep,))
    _compile(run.model, args)
    generate(run.model, as_batch(ids), None, streamer=stream, **options)
    if not args.stream:
        sys.stdout.write(shown[0][len(tok.decode(ids[1:])) :])
    sys.stdout.write("\n")
    return 0


def cmd_sinks(args) -> int | Route:
    return Route("sinks", args.run)


def sinks_run(args) -> int:
    """``multihead sinks RUN``: StreamingLLM's three caches on held-out text longer than the trained rows."""
    from .._proc import set_threads

    from .._io import check_target
    from ..interpret.kv import streaming as S
    from ..train.pretrain import held_out_rows, load_pretrain_run

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


def cmd_induction(args) -> int | Route:
    """``multihead induction``: the phase change of Olsson et al. in a 2-layer attention-only model."""
    from .._proc import set_threads

    from .._io import Publish, atomic_write_json, check_target
    from ..interpret.roles import induction as I

    toy = I.ToyConfig()  # the defaults of the flags left out (read here: the parser is built without torch)
    for flag, field in (("steps", "steps"), ("heads", "num_heads"), ("half", "half"), ("vocab", "vocab")):
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(toy, field))
    if args.model:
        return Route("induction", args.model)
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


# ---------------------------------------------------------------------------------------------------- pretrained LMs
def _load_lm(source: str, threads: int | None = None):
    """The pretrained causal LM ``source`` (native or attached), through the one loader."""
    from .._proc import set_threads
    from ..loading import load

    set_threads(threads)
    p = load(source, progress=True).detail
    say_attached(p)
    return p


def generate_seq2seq(args) -> int:
    """``multihead generate FOLDER "text"`` on an HF sequence-to-sequence folder: the text read by the encoder and
    the output written by the decoder (greedy, HF's ``generate`` with multihead's attention), never the decoder
    alone."""
    from ..loading import load as load_source

    if args.chat:
        raise ValueError("--chat takes a causal LM with a chat template; a sequence-to-sequence model reads the text")
    if args.sample:
        raise ValueError("a sequence-to-sequence folder decodes greedily here; drop --sample")
    if not args.prompt.strip():
        raise ValueError('a sequence-to-sequence model writes from a text it reads; pass one, e.g. "The cat sat."')
    folder = load_source(args.run).detail
    out = folder.translate(folder.encode(args.prompt), max_new_tokens=args.max_new)
    print(folder.tokenizer.decode(out, skip_special_tokens=True))
    return 0


def _compile(model, args) -> None:
    """``generate --compile``: the compiled decoding step (refused with the reason where it cannot serve)."""
    if getattr(args, "compile", None):
        from ..models import fast_decode

        why = fast_decode.why_not_compile(model)
        if why is not None:
            raise ValueError(f"--compile compiles multihead's own decoding step; {why}: drop --compile")
        whole, native = args.compile == "step", fast_decode.decoding_model(model)
        if whole and fast_decode.why_not_architecture(native) is None and fast_decode.why_not_whole(native):
            raise ValueError(f"--compile step: {fast_decode.why_not_whole(native)}; plain --compile serves this model")
        print(
            f"compiling the decoding {'step as one graph' if whole else 'step'} (kept on disk for the next run)",
            file=sys.stderr,
        )
        fast_decode.compile(model, whole_step=whole)


def generate_lm(args) -> int:
    """Continue a prompt (or, with ``--chat``, answer it through the model's chat template), streaming tokens."""
    from ..data.batching import as_batch

    from ..models.generation import generate as run

    p = _load_lm(args.run, args.threads)
    if args.dtype != "fp32":  # weights stored in that format (refused, with the reason, where the path cannot serve)
        from ..models.precision import convert

        convert(p.model, args.dtype)
    prompt = p.chat(args.prompt) if args.chat else args.prompt
    ids = p.encode(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens and the model adds no start token; pass a prompt")
    limit = p.model.config.max_len
    if len(ids) + args.max_new > limit:
        raise ValueError(
            f"the prompt ({len(ids)} tokens) plus --max-new {args.max_new} exceeds the model's {limit} "
            f"positions; use --max-new {max(limit - len(ids), 0)} or a shorter prompt"
        )
    out, shown = [], [""]

    def stream(tokens, alive) -> None:
        if not bool(alive[0]):
            return
        out.append(int(tokens[0]))
        text = p.tokenizer.decode(out, skip_special_tokens=True)
        if args.stream:
            sys.stdout.write(text[len(shown[0]) :] if text.startswith(shown[0]) else "\n" + text)
            sys.stdout.flush()
        shown[0] = text

    sys.stdout.write(args.prompt if not args.chat else "")
    options = _decoding(args, p.eos_ids)
    _compile(p.model, args)
    if hasattr(p.model, "hf"):  # attached: HF's generate loop with multihead's attention
        p.model.generate(as_batch(ids), streamer=stream, **options)
    else:
        run(p.model, as_batch(ids), None, streamer=stream, **options)
    if not args.stream:
        sys.stdout.write(shown[0])
    sys.stdout.write("\n")
    return 0


def sinks_lm(args) -> int:
    """StreamingLLM's three caches on held-out IMDB text (concatenated reviews) far longer than the window."""
    from .._io import check_target
    from ..heads.lm import held_out_rows
    from ..interpret.kv import streaming as S

    if args.out:
        check_target(args.out, "sinks", overwrite=args.overwrite, sources=(args.run,))
    p = _load_lm(args.run, args.threads)
    length = args.length or 2048
    window = args.window or 256
    band = args.band or window
    if length <= window + args.sinks or length < 2 * band:
        raise ValueError(
            f"--length {length} must exceed the window plus the sinks ({window} + {args.sinks}) and hold "
            f"two bands of {band} tokens"
        )
    rows = held_out_rows(p, rows=args.texts, length=length)
    result = S.compare(p.model, rows, window=window, sinks=args.sinks, band=band, progress=True)
    result["model"] = str(args.run)
    result["data"] = "imdb test split, reviews concatenated"
    S.report(result, args.out, overwrite=args.overwrite, sources=(args.run,))
    return 0


def induction_lm(args) -> int:
    """Prefix-matching and copying scores of every head of a pretrained LM on repeated random tokens, and the
    ablation check: the top induction heads masked vs as many random heads."""
    from .._io import Publish, atomic_write_json, check_target
    from ..interpret.roles import induction as I

    check_target(args.out, "induction", overwrite=args.overwrite, sources=(args.model,))
    p = _load_lm(args.model, args.threads)
    low = min(1000, p.model.config.vocab_size // 10)  # ordinary tokens (past the special ones)
    start = p.bos_id if p.bos_id is not None else low
    scores = I.induction_scores(p.model, half=args.half, batch=args.batch, low=low, start=start, seed=args.seed)
    passing_count = int((scores["prefix_matching"] >= I.INDUCTION).sum())
    k = args.ablate if args.ablate is not None else max(passing_count, 1)  # default: the heads that pass the rule
    check = I.ablation(
        p.model,
        scores["prefix_matching"],
        k=k,
        half=args.half,
        batch=args.batch,
        low=low,
        start=start,
        seed=args.seed + 1,
    )
    result = {
        "model": str(args.model),
        "half": args.half,
        "batch": args.batch,
        "rule": f"induction: prefix-matching score >= {I.INDUCTION}",
        "prefix_matching": scores["prefix_matching"].tolist(),
        "copying": scores["copying"].tolist(),
        "roles": I.induction_roles(scores["prefix_matching"]),
        "loss_first_half": scores["loss_first_half"],
        "loss_second_half": scores["loss_second_half"],
        "ablation": check,
    }
    heads = [(l, h, v) for l, row in enumerate(result["prefix_matching"]) for h, v in enumerate(row)]
    passing = sorted((x for x in heads if x[2] >= I.INDUCTION), key=lambda x: -x[2])
    result["induction_heads"] = [{"layer": l, "head": h, "prefix_matching": round(v, 4)} for l, h, v in passing]
    with Publish(args.out, "induction", overwrite=args.overwrite, sources=(args.model,)) as folder:
        atomic_write_json(folder / "induction.json", result)
        I.plot_scores(result, folder / "induction.png", f"{args.model}: induction heads on repeated random tokens")
    print(I.format_scores(result))
    print(
        f"{len(passing)} of {len(heads)} heads pass the rule; top: "
        + ", ".join(f"L{l}H{h} {v:.2f}" for l, h, v in passing[:8])
    )
    which = (
        f"the {check['k']} heads that pass the rule"
        if check["k"] == len(passing)
        else f"the top {check['k']} heads by prefix matching ({len(passing)} pass the rule)"
    )
    print(
        f"ablation, on fresh repeated sequences (not the ones scored above, so its unmasked loss differs): "
        f"repeated-half loss {check['base']:.3f} with nothing masked -> {check['top']:.3f} with {which} masked; "
        f"{check['random_mean']:.3f} (mean of {len(check['random'])} draws) with {check['k']} random heads masked"
    )
    print(f"wrote {Path(args.out) / 'induction.json'} and induction.png")
    return 0


MAP_BUDGET = 1 << 30  # bytes of attention maps heads keeps; past it, the exact statistics (no map) are used


def _heads_kv(args, p) -> int:
    """``heads MODEL --kv``: which heads a head-aware KV cache keeps whole (kv-heads.json, kv-heads.png)."""
    import json

    from ..interpret.kv import heads as kv_heads

    result = kv_heads.report(
        p,
        args.out,
        needles=args.needles,
        length=args.needle_len,
        fraction=args.kv_fraction,
        score=args.kv_score,
        overwrite=args.overwrite,
        progress=not args.json,
    )
    print(json.dumps(result) if args.json else kv_heads.format_table(result, p.name))
    if args.out:
        print(f"wrote kv-heads.json and kv-heads.png to {args.out}", file=sys.stderr if args.json else sys.stdout)
    return 0


def heads_lm(args) -> int:
    """Head roles of a pretrained LM on real text (previous token, first-token sink, broad, ...) with induction
    heads marked from repeated random tokens; from exact statistics (no map) at long lengths."""
    import json
    import resource
    import time

    from .._io import check_target
    from ..heads.lm import held_out_rows
    from ..interpret.roles import induction as I
    from ..interpret.roles import scores as roles
    from ..interpret.maps import LMSubject

    if args.out:
        check_target(args.out, "heads", overwrite=args.overwrite, sources=(args.model,))
    p = _load_lm(args.model)
    if args.kv:
        return _heads_kv(args, p)
    length = args.max_len or 512
    subject = LMSubject(str(args.model), p.model, p.tokenizer, length, lm=p)
    rows = held_out_rows(p, rows=args.n, length=length)
    starts = len(p.encode(""))  # a start token the tokenizer adds (and adds again when the text is encoded)
    texts = [p.decode(r[starts:]) for r in rows.tolist()]
    c = p.model.config.decoder
    map_bytes = len(texts) * c.num_layers * c.num_heads * length * length * 4  # every map of every text, float32
    source = args.source or ("stats" if length > 1024 or map_bytes > MAP_BUDGET else "maps")
    t0 = time.perf_counter()
    if source == "maps":
        result = roles.analyse(subject.maps(texts, batch_size=1))
    else:
        stats, tokens = roles.subject_head_stats(subject, texts, batch_size=1)
        result = roles.summarise(stats, subject.name, len(texts), tokens, "stats")
    seconds = time.perf_counter() - t0
    low = min(1000, p.model.config.vocab_size // 10)
    half = min(64, (p.model.config.max_len - 1) // 2)
    ind = I.induction_scores(p.model, half=half, batch=8, low=low, start=p.bos_id if p.bos_id is not None else low)
    I.mark_induction(result, ind["prefix_matching"])
    result["data"] = {"name": "imdb", "split": "test", "n": len(texts), "tokens_per_input": length}
    result["seconds"] = round(seconds, 2)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(result) if args.json else roles.format_table(result))
    print(
        f"{source}: {len(texts)} x {length} tokens in {seconds:.1f}s, peak RSS {result['peak_rss_mib']:.0f} MiB",
        file=sys.stderr if args.json else sys.stdout,
    )
    if args.out:
        files = roles.write(result, Path(args.out), overwrite=args.overwrite)
        print(f"wrote {', '.join(str(f) for f in files)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def importance_lm(args) -> int:
    """``importance`` on a pretrained LM: :func:`multihead.heads.lm.importance_report`."""
    return _importance_lm(args, prune=False)


def prune_lm(args) -> int:
    """``prune`` on a pretrained LM: importance, then whole GQA groups removed at each fraction."""
    return _importance_lm(args, prune=True)


def _importance_lm(args, *, prune: bool) -> int:
    from .._io import check_target
    from ..heads import lm as H
    from ..heads.scores import format_table

    out = Path(args.out) if args.out else None
    if out is None:
        raise ValueError("pass --out FOLDER: where to write the scores (a pretrained model has no run folder)")
    overwrite = getattr(args, "overwrite", False)
    check_target(out, "importance", overwrite=overwrite, sources=(args.run,))
    p = _load_lm(args.run, getattr(args, "threads", None))
    fractions = args.fractions if prune else ()
    result = H.importance_report(
        p,
        out,
        source=str(args.run),
        n=args.n or 16,
        fractions=fractions,
        overwrite=overwrite,
        save=prune and args.save,
    )
    print(format_table(result["importance"], f"head importance of {args.run} (rows: layers)"))
    print(f"perplexity on held-out IMDB text: {result['perplexity']:.2f}")
    for frac, r in result.get("fractions", {}).items():
        print(
            f"prune {float(frac):.0%} ({r['heads_pruned']}/{r['of']} query heads, whole GQA groups): perplexity "
            f"{r['perplexity_pruned']:.2f} (random groups masked: {r['perplexity_random_groups_masked']:.2f}); "
            f"decode {r['decode_tokens_per_s']:.1f} tokens/s vs {result['decode_tokens_per_s']['unpruned']:.1f}"
        )
        if "saved" in r:
            print(
                f"  saved {out / r['saved']['folder']}: {r['saved']['heads_per_layer']} heads per layer as stored, "
                f"read back by transformers: max |logit diff| {r['saved']['max_abs_logit_diff']:.1e}"
            )
    print(f"wrote {out / 'importance-michel.json'} and importance.png")
    return 0


def _pruned_heads(path: str, fraction: float | None) -> dict[int, list[int]]:
    """The heads ``multihead prune`` chose at ``fraction``, from its folder or its importance-michel.json, checked
    for shape (layer -> list of head indices) before anything is loaded."""
    from .._io import read_json_file

    file = Path(path) / "importance-michel.json" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ValueError(
            f"--prune {path}: no {file} to read; pass the --out folder of `multihead prune MODEL` (it holds "
            "importance-michel.json) or that file"
        )
    report = read_json_file(file)
    fractions = report.get("fractions") if isinstance(report, dict) else None
    if not isinstance(fractions, dict) or not fractions:
        raise ValueError(f"{file} holds no pruned fractions; make it with `multihead prune MODEL --out DIR`")
    chosen = [v for k, v in fractions.items() if fraction is not None and _same_fraction(k, fraction)]
    if not chosen:
        raise ValueError(f"pass --fraction, one of {', '.join(sorted(fractions))} (the fractions {file} holds)")
    heads = chosen[0].get("pruned_heads") if isinstance(chosen[0], dict) else None
    ok = isinstance(heads, dict) and all(
        str(k).isdigit() and isinstance(v, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in v)
        for k, v in heads.items()
    )
    if not ok:
        raise ValueError(
            f"{file}: fraction {fraction}'s pruned_heads must map layer numbers to lists of head indices; it is not "
            "what `multihead prune` writes: make it again"
        )
    return {int(k): list(v) for k, v in heads.items()}


def _same_fraction(key: str, fraction: float) -> bool:
    try:
        return abs(float(key) - fraction) < 1e-9
    except ValueError:
        return False


def export_attached(args) -> int:
    """``export`` of an HF folder read attached: written back through transformers, pruned with --prune."""
    return export_lm(args, attached=True)


def export_lm(args, *, attached: bool = False) -> int:
    from .. import lm
    from .._io import check_target

    check_target(args.out, "hf", overwrite=args.overwrite, sources=(args.source,))
    if args.prune and not attached:
        raise ValueError(
            "--prune writes a pruned model through transformers: read the folder attached, hf:FOLDER (multihead's "
            "own export writes one head count for every layer)"
        )
    heads = _pruned_heads(args.prune, args.fraction) if args.prune else {}
    p = _load_lm(args.source)
    if attached:
        from ..hf.heads import prune_heads, save_pruned

        if heads:
            prune_heads(p.model.hf, heads)
        r = save_pruned(p.model.hf, args.out, tokenizer_from=p.path, overwrite=args.overwrite, sources=(args.source,))
        pruned = sum(len(v) for v in heads.values())
        print(
            f"wrote an HF {p.model.config.model_type} folder to {args.out}"
            + (f" with {pruned} heads removed ({r['heads_per_layer']} heads per layer as stored)" if heads else "")
            + f"; read back by transformers, max |logit diff| {r['max_abs_logit_diff']:.1e}"
        )
        return 0
    out = lm.export(p.model, args.out, pretrained=p, overwrite=args.overwrite, sources=(args.source,))
    print(
        f"wrote an HF folder to {out} (config.json, generation_config.json, model.safetensors, tokenizer.json, "
        "tokenizer_config.json with the chat template); load it with "
        "transformers.AutoModelForCausalLM.from_pretrained"
    )
    return 0


def _parser_generate(sub) -> None:
    ge = sub.add_parser(
        "generate",
        help="continue a prompt with a pretrained LM (smollm2, a .gguf file, an HF folder) or a causal LM run "
        "(multihead pretrain --objective clm), streaming tokens; --chat applies the model's chat template",
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
    ge.add_argument("--threads", type=_threads, default=None, help="torch threads")
    ge.add_argument("--no-stream", dest="stream", action="store_false", help="print the text once, at the end")
    ge.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "int8"),
        default="fp32",
        help="store the linear weights in bf16 or int8 for decoding (weight-only; float32 activations and cache; "
        "its error: multihead bench precision)",
    )
    ge.add_argument(
        "--compile",
        nargs="?",
        const="layers",
        default=None,
        choices=("layers", "step"),
        help="decode through the compiled step (torch.compile; needs a C++ compiler), the same tokens: 'layers' (the "
        "default) compiles the arithmetic around each layer's attention, 'step' one graph for the whole step (its "
        "first compile takes a minute or more). Whether either is faster depends on the CPU (multihead bench decode "
        "--impls cached,compiled,compiled_step says); without this flag decoding measures its products once and "
        "takes the faster",
    )
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
    sk.add_argument("--threads", type=_threads, default=None)
    sk.add_argument("--out", default=None, help="write sinks.json and sinks.png here")
    sk.add_argument("--overwrite", action="store_true")
    sk.set_defaults(fn=cmd_sinks)


def cmd_kv(args) -> int | Route:
    return Route("kv", args.model)


def kv_lm(args) -> int:
    """``multihead kv MODEL``: every KV cache policy at every budget on needles and perplexity (kv.json, kv.png)."""
    from .._io import check_target
    from ..interpret.kv import curves as kv_curves
    from ..interpret.kv.heads import read_split

    check_target(args.out, "kv", overwrite=args.overwrite, sources=(args.model,))
    args.policies = args.policies or list(kv_curves.POLICIES)  # the defaults (the parser is built without torch)
    args.budgets = args.budgets or list(kv_curves.BUDGETS)
    args.lengths = args.lengths or list(kv_curves.LENGTHS)
    full_heads = read_split(args.heads) if args.heads else None
    kv_curves.settings(args.policies, args.budgets, full_heads)  # refuse head-aware without --heads before loading
    p = _load_lm(args.model, args.threads)
    result = kv_curves.report(
        p,
        args.out,
        overwrite=args.overwrite,
        full_heads=full_heads,
        policies=args.policies,
        budgets=args.budgets,
        lengths=args.lengths,
        needles=args.needles,
        context=args.context,
        tokens=args.tokens,
        progress=not args.no_progress,
    )
    print(kv_curves.format_table(result))
    print(f"wrote kv.json and kv.png to {args.out} ({result['seconds']:.0f} s, {result['threads']} threads)")
    return 0


def _parser_kv(sub) -> None:
    kv = sub.add_parser(
        "kv",
        help="KV cache policies (window, H2O, SnapKV, TOVA, Ada-KV, Expected Attention, head-aware, ...) at several "
        "budgets: needle retrieval at long context and perplexity against the bytes kept (kv.json, kv.png)",
    )
    kv.add_argument("model", help="a pretrained LM multihead reads natively (smollm2, a .gguf file, an HF folder)")
    kv.add_argument("--out", required=True, help="folder for kv.json and kv.png")
    kv.add_argument("--heads", default=None, help="kv-heads.json from `multihead heads MODEL --kv` (for head-aware)")
    kv.add_argument(
        "--policies",
        type=_names(LazyChoices("multihead.interpret.kv.curves", "POLICIES")),
        default=None,
        help="comma-separated (default: every policy a recorded prompt serves)",
    )
    kv.add_argument("--budgets", type=_counts, default=None, help="keys kept per head (default 64,...,1024)")
    kv.add_argument("--lengths", type=_counts, default=None, help="needle prompt tokens (default 2048,4096,8192)")
    kv.add_argument(
        "--needles",
        type=_number(int, 1, MAX_NEEDLES, f"a number of needles in [1, {MAX_NEEDLES}]"),
        default=4,
        help=f"needles per length (default 4, at most {MAX_NEEDLES})",
    )
    kv.add_argument("--context", type=_count, default=2048, help="perplexity: tokens read before measuring")
    kv.add_argument("--tokens", type=_count, default=256, help="perplexity: tokens measured one at a time")
    kv.add_argument("--threads", type=_threads, default=None)
    kv.add_argument("--overwrite", action="store_true")
    kv.add_argument("--no-progress", action="store_true")
    kv.set_defaults(fn=cmd_kv)


def _parser_induction(sub) -> None:
    ind = sub.add_parser(
        "induction",
        help="induction heads form: a 2-layer attention-only model trained on "
        "repeated random tokens (loss curves, prefix-matching scores, PNG)",
    )
    ind.add_argument("--out", required=True, help="folder for induction.json and induction.png")
    ind.add_argument("--steps", type=_count, default=None, help="training steps (default 3000)")
    ind.add_argument("--heads", type=_count, default=None, help="heads per layer (default 4)")
    ind.add_argument(
        "--half",
        type=_number(int, 1, 1024, "an integer in [1, 1024]"),
        default=None,
        help="random tokens before the repeat (default 24)",
    )
    ind.add_argument(
        "--vocab",
        type=_number(int, 2, 65536, "an integer in [2, 65536]"),
        default=None,
        help="token ids the random tokens are drawn from (default 256; small: repeats inside a half blur the score)",
    )
    ind.add_argument("--seed", type=int, default=0)
    ind.add_argument(
        "--model",
        default=None,
        help="score a pretrained LM's heads instead of training the toy model "
        "(smollm2, a .gguf file, an HF folder), with the ablation check",
    )
    ind.add_argument("--batch", type=_count, default=8, help="--model: repeated-token sequences scored")
    ind.add_argument(
        "--ablate",
        type=_count,
        default=None,
        help="--model: top induction heads masked in the check (default: the heads that pass the rule)",
    )
    ind.add_argument("--threads", type=_threads, default=None)
    ind.add_argument("--overwrite", action="store_true")
    ind.add_argument("--no-progress", action="store_true")
    ind.set_defaults(fn=cmd_induction)


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    _parser_generate(sub)
    _parser_sinks(sub)
    _parser_kv(sub)
    _parser_induction(sub)
