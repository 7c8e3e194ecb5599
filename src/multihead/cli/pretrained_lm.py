"""The commands that take a pretrained causal LM (``smollm2``, a ``.gguf`` file, an HF Llama-family or GPT-2
folder) where they take a run folder: ``generate``, ``sinks``, ``heads``, ``induction --model``, ``importance``,
``prune`` and ``export``. Each handler here is called by the command's own handler when its source is an LM
(:func:`multihead.loading.route`), so that a command decides what its source is in one place.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _load(source: str, threads: int | None = None):
    from .._proc import set_threads

    from .. import lm

    set_threads(threads)
    return lm.load(source, progress=True)


def generate(args) -> int:
    """Continue a prompt (or, with ``--chat``, answer it through the model's chat template), streaming tokens."""
    from ..data.batching import as_batch

    from ..models.generation import generate as run

    p = _load(args.run, args.threads)
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
    options = dict(
        strategy="sample" if args.sample else "greedy",
        max_new_tokens=args.max_new,
        stop_tokens=p.eos_ids,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    run(p.model, as_batch(ids), None, streamer=stream, **options)
    if not args.stream:
        sys.stdout.write(shown[0])
    sys.stdout.write("\n")
    return 0


def sinks(args) -> int:
    """StreamingLLM's three caches on held-out IMDB text (concatenated reviews) far longer than the window."""
    from .._io import check_target
    from ..heads.lm import held_out_rows
    from ..interpret import streaming as S

    if args.out:
        check_target(args.out, "sinks", overwrite=args.overwrite, sources=(args.run,))
    p = _load(args.run, args.threads)
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


def induction(args) -> int:
    """Prefix-matching and copying scores of every head of a pretrained LM on repeated random tokens, and the
    ablation check: the top induction heads masked vs as many random heads."""
    from .._io import Publish, atomic_write_json, check_target
    from ..interpret import induction as I

    check_target(args.out, "induction", overwrite=args.overwrite, sources=(args.model,))
    p = _load(args.model, args.threads)
    low = min(1000, p.model.config.vocab_size // 10)  # ordinary tokens (past the special ones)
    start = p.bos_id if p.bos_id is not None else low
    scores = I.induction_scores(p.model, half=args.half, batch=args.batch, low=low, start=start, seed=args.seed)
    check = I.ablation(
        p.model,
        scores["prefix_matching"],
        k=args.ablate,
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
    print(
        f"ablation: repeated-half loss {check['base']:.3f} -> {check['top']:.3f} with the top {check['k']} "
        f"induction heads masked, {check['random_mean']:.3f} (mean of {len(check['random'])} draws) with "
        f"{check['k']} random heads masked"
    )
    print(f"wrote {Path(args.out) / 'induction.json'} and induction.png")
    return 0


def heads(args) -> int:
    """Head roles of a pretrained LM on real text (previous token, first-token sink, broad, ...) with induction
    heads marked from repeated random tokens; from exact statistics (no map) at long lengths."""
    import json
    import resource
    import time

    from .._io import check_target
    from ..heads.lm import held_out_rows
    from ..interpret import induction as I
    from ..interpret import roles
    from ..interpret.maps import LMSubject

    if args.out:
        check_target(args.out, "heads", overwrite=args.overwrite, sources=(args.model,))
    p = _load(args.model)
    length = args.max_len or 512
    subject = LMSubject(str(args.model), p.model, p.tokenizer, length, lm=p)
    rows = held_out_rows(p, rows=args.n, length=length)
    starts = len(p.encode(""))  # a start token the tokenizer adds (and adds again when the text is encoded)
    texts = [p.decode(r[starts:]) for r in rows.tolist()]
    source = args.source or ("stats" if length > 1024 else "maps")
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
    for h in result["heads"]:
        h["prefix_matching"] = round(float(ind["prefix_matching"][h["layer"], h["head"]]), 4)
        if h["prefix_matching"] >= I.INDUCTION:
            h["role"] = "induction"
    result["counts"] = {r: sum(1 for x in result["heads"] if x["role"] == r) for r in roles.ROLES}
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


def importance_and_prune(args, *, prune: bool) -> int:
    """``importance``/``prune`` on a pretrained LM: :func:`multihead.heads.lm.importance_report`."""
    from .._io import check_target
    from ..heads import lm as H
    from ..heads.scores import format_table

    out = Path(args.out) if args.out else None
    if out is None:
        raise ValueError("pass --out FOLDER: where to write the scores (a pretrained model has no run folder)")
    overwrite = getattr(args, "overwrite", False)
    check_target(out, "importance", overwrite=overwrite, sources=(args.run,))
    p = _load(args.run, getattr(args, "threads", None))
    fractions = args.fractions if prune else ()
    result = H.importance_report(p, out, source=str(args.run), n=args.n or 16, fractions=fractions, overwrite=overwrite)
    print(format_table(result["importance"], f"head importance of {args.run} (rows: layers)"))
    print(f"perplexity on held-out IMDB text: {result['perplexity']:.2f}")
    for frac, r in result.get("fractions", {}).items():
        print(
            f"prune {float(frac):.0%} ({r['heads_pruned']}/{r['of']} query heads, whole GQA groups): perplexity "
            f"{r['perplexity_pruned']:.2f} (random groups masked: {r['perplexity_random_groups_masked']:.2f}); "
            f"decode {r['decode_tokens_per_s']:.1f} tokens/s vs {result['decode_tokens_per_s']['unpruned']:.1f}"
        )
    print(f"wrote {out / 'importance-michel.json'} and importance.png")
    return 0


def export(args) -> int:
    from .. import lm
    from .._io import check_target

    check_target(args.out, "hf", overwrite=args.overwrite, sources=(args.source,))
    p = _load(args.source)
    out = lm.export(p.model, args.out, tokenizer=p.tokenizer, overwrite=args.overwrite, sources=(args.source,))
    print(
        f"wrote an HF folder to {out} (config.json, model.safetensors, tokenizer.json); load it with "
        "transformers.AutoModelForCausalLM.from_pretrained"
    )
    return 0
