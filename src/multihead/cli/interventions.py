"""``multihead patch``, ``multihead attribute`` and ``multihead circuit``: causal interventions on the heads of a
causal LM (a pretrained one -- smollm2, a .gguf file, an HF folder -- or a ``multihead pretrain --objective clm``
run)."""

from __future__ import annotations

import json
from pathlib import Path

from .args import Route


def _load(source: str):
    """``(model, encode(text) -> ids, token(text) -> one id, texts(ids) -> token strings)`` for a pretrained LM or
    a causal LM run."""
    from ..lm import LMError
    from ..loading import route

    if route(source, "patch") in ("lm", "attached"):
        from .lm import _load_lm

        p = _load_lm(source)

        def one(text: str) -> int:
            ids = p.encode(text, special=False)
            if len(ids) != 1:
                raise LMError(
                    f"{text!r} is {len(ids)} tokens for this model ({ids}); the answer must be one token "
                    '(names usually need a leading space, e.g. " Mary")'
                )
            return ids[0]

        return p.model, _checked(p.encode, p.model.config.max_len), one, p.token_texts
    from ..data.tokenizer import SEP
    from ..train.pretrain import load_pretrain_run

    run = load_pretrain_run(source)
    if run.config.objective.name != "clm":
        raise ValueError(f"{source} is a masked-LM run; patching reads a causal LM's next-token logits")
    tok = run.tokenizer

    def encode(text: str) -> list[int]:
        return [tok.token_to_id(SEP), *tok.encode(text, add_special_tokens=False).ids]

    def one_run(text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens for this model; the answer must be one token")
        return ids[0]

    texts = lambda ids: [tok.id_to_token(int(i)) or "?" for i in ids]  # noqa: E731
    return run.model, _checked(encode, run.config.causal.max_len), one_run, texts


def _checked(encode, limit: int):
    """``encode`` refusing a text that gives no tokens (nothing to predict from) or more than the model's positions."""

    def run(text: str) -> list[int]:
        ids = encode(text)
        if not ids:
            raise ValueError(
                f"the text {text!r} encodes to no tokens and the model adds no start token: pass some text to predict from"
            )
        if len(ids) > limit:
            raise ValueError(f"the text is {len(ids):,} tokens and the model reads at most {limit:,}: shorten it")
        return ids

    return run


def _pairs(args) -> list[dict]:
    if args.file:
        rows = []
        for n, line in enumerate(Path(args.file).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(
                    f'{args.file}:{n} is not JSON ({exc}); each line holds {{"clean": ..., "corrupt": '
                    '..., "answer": ..., "wrong": ...}}'
                ) from None
            if not isinstance(row, dict) or not {"clean", "corrupt", "answer"} <= set(row):
                raise ValueError(f"{args.file}:{n} needs the keys clean, corrupt and answer (wrong for logit-diff)")
            rows.append(row)
        if not rows:
            raise ValueError(f"{args.file} holds no pairs")
        return rows
    if args.clean is None or args.corrupt is None or args.answer is None:
        raise ValueError(
            "pass --clean TEXT --corrupt TEXT --answer TOKEN (and --wrong TOKEN for logit-diff), or --file pairs.jsonl"
        )
    return [{"clean": args.clean, "corrupt": args.corrupt, "answer": args.answer, "wrong": args.wrong}]


def cmd_patch(args) -> int | Route:
    return Route("patch", args.model)


def _checked_pairs(args) -> list[dict]:
    from .._io import check_target

    check_target(args.out, "importance", overwrite=args.overwrite, sources=(args.model,))
    pairs = _pairs(args)
    if args.metric == "logit-diff" and any(not p.get("wrong") for p in pairs):
        raise ValueError('--metric logit-diff needs --wrong TOKEN (or "wrong" in every line of --file)')
    return pairs


def patch(args) -> int:
    """Activation patching of every head (and attribution patching beside it), averaged over the pairs."""
    pairs = _checked_pairs(args)
    if args.decoder is not None:
        raise ValueError("--decoder is for sequence-to-sequence folders; a causal LM predicts after its prompt")
    model, encode, one, texts = _load(args.model)
    return _patched(args, pairs, model, encode, one, texts, lambda ids: -1)


def patch_attached(args) -> int:
    """Activation patching on an HF encoder folder (a masked LM: the answer at its mask token) or a
    sequence-to-sequence folder (the encoder reads the prompts, the decoder predicts the answer after
    ``--decoder``'s tokens)."""
    from ..hf.models import NextToken
    from ..loading import load as load_source

    from ..loading import kind

    pairs = _checked_pairs(args)
    if args.decoder is not None and kind(args.model).role != "seq2seq":  # from the config, before any weight
        raise ValueError("--decoder is for sequence-to-sequence folders; an encoder's answer is at its mask token")
    folder = load_source(args.model).detail
    tok = folder.tokenizer

    def one(text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens for this model ({ids}); the answer must be one token")
        return ids[0]

    def encode(text: str) -> list[int]:
        return folder.encode(text)[: folder.max_len]

    vocab = folder.hf.get_output_embeddings()
    if folder.role == "seq2seq":
        prefix = [folder.decoder_start, *(tok.encode(args.decoder or "", add_special_tokens=False).ids)]
        return _patched(args, pairs, NextToken(folder.hf, prefix), encode, one, folder.tokens, lambda ids: -1)
    if vocab is None:
        raise ValueError(
            f"{args.model} has no masked-LM head (its config names {folder.hf_config.get('architectures')}); patching "
            "an encoder reads the token it predicts at the mask: pass a *ForMaskedLM folder"
        )
    mask = next((t for t in ("[MASK]", "<mask>") if tok.token_to_id(t) is not None), None)
    if mask is None:
        raise ValueError(f"{args.model}'s tokenizer has no mask token ([MASK] or <mask>) to predict at")
    mask_id = tok.token_to_id(mask)

    def position(ids: list[int]) -> int:
        if ids.count(mask_id) != 1:
            raise ValueError(
                f"each prompt must hold the mask token {mask} once (the answer is what the model puts there); "
                f"{folder.tokens(ids)} holds it {ids.count(mask_id)} times"
            )
        return ids.index(mask_id)

    return _patched(args, pairs, folder.model, encode, one, folder.tokens, position)


def _patched(args, pairs, model, encode, one, texts, position) -> int:
    """Patch every head over ``pairs`` and publish the numbers, the heat map and the page."""
    from .._io import Publish, atomic_write_json
    from ..heads import scores as plots
    from ..interpret.causal import patching as P
    from ..interpret.causal.patch_page import write_patch_page
    from ..modules.capture import attention_modules

    def metric(pair):
        answer, at = one(pair["answer"]), position(encode(pair["corrupt"]))
        if at != position(encode(pair["clean"])):
            raise ValueError("the clean and corrupted prompts must hold the mask token at the same position")
        if args.metric == "logit-diff":
            return P.logit_diff(answer, one(pair["wrong"]), at)
        return P.token_probability(answer, at)

    r = P.patch_pairs(
        model,
        [(P.as_batch(encode(p["clean"])), P.as_batch(encode(p["corrupt"])), metric(p)) for p in pairs],
        batch_size=args.batch,
        per_position=args.positions,
    )
    effect, values = r["effect"], r["per_pair"]
    result = {
        "model": str(args.model),
        "metric": args.metric,
        "pairs": pairs,
        "per_pair": values,
        "layers": [name for name, _ in attention_modules(model)],
        "effect": effect.tolist(),
        "rule": "effect = metric(corrupted run with the head's clean activation) - metric(corrupted run)",
    }
    if "attribution" in r:
        result["attribution"] = r["attribution"].tolist()
        result["correlation"] = r["correlation"]
    with Publish(Path(args.out), "importance", overwrite=args.overwrite, sources=(args.model,)) as folder:
        atomic_write_json(folder / "importance-patching.json", result)
        grid = P.per_head(effect)
        plots.plot(
            grid,
            folder / "importance",
            f"{args.model}: activation patching ({args.metric}, clean -> corrupted, mean of {len(pairs)} pairs)",
        )
        write_patch_page(folder / "patch.html", result, tokens=texts(encode(pairs[0]["corrupt"])))
    print(
        plots.format_table(
            P.per_head(effect),
            f"activation patching, {args.metric}: clean {values[0]['clean']:.3f}, corrupted "
            f"{values[0]['corrupt']:.3f} (first pair)",
        )
    )
    if "correlation" in result:
        print(f"attribution patching vs exact over all heads: correlation {result['correlation']:.3f}")
    print(f"wrote {Path(args.out) / 'importance-patching.json'}, importance.png and patch.html (open it in a browser)")
    return 0


def cmd_attribute(args) -> int | Route:
    return Route("attribute", args.model)


def attribute(args) -> int:
    """Direct logit attribution of the next token after a text."""
    from ..data.batching import as_batch

    from ..interpret.causal import patching as P

    model, encode, one, _ = _load(args.model)
    ids = as_batch(encode(args.text))
    r = P.direct_logit_attribution(model, ids, one(args.answer), one(args.wrong) if args.wrong else None)
    heads = r["heads"]
    top = sorted(
        ((float(heads[l, h]), l, h) for l in range(heads.shape[0]) for h in range(heads.shape[1])),
        key=lambda t: -abs(t[0]),
    )[: args.top]
    what = f"logit[{args.answer!r}]" + (f" - logit[{args.wrong!r}]" if args.wrong else "")
    print(f"{what} = {r['check']['logit_difference']:.3f}; parts add up to {r['check']['sum_of_parts']:.3f}")
    print(
        f"  embedding {r['embed']:+.3f}, MLPs {float(r['mlp'].sum()):+.3f}, heads {float(heads.sum()):+.3f}, "
        f"biases {r['bias'] + r['final_bias']:+.3f}"
    )
    print("  heads writing most directly: " + ", ".join(f"L{l}H{h} {v:+.3f}" for v, l, h in top))
    if args.json:
        print(json.dumps({**r, "heads": heads.tolist(), "mlp": r["mlp"].tolist()}))
    return 0


def cmd_circuit(args) -> int | Route:
    return Route("circuit", args.model)


def circuit(args) -> int:
    """A circuit of the literature looked for with path, activation and attribution patching: the induction
    circuit or indirect object identification; numbers, a picture and a summary."""
    from .._io import Publish, atomic_write_json, check_target
    from ..interpret.causal import circuits as C
    from .lm import _load_lm

    check_target(args.out, "circuit", overwrite=args.overwrite, sources=(args.model,))
    p = _load_lm(args.model)
    progress = not args.no_progress
    if args.task == "induction":
        vocab = p.model.config.vocab_size
        low = min(1000, vocab // 10)  # ordinary tokens, past the special ones
        r = C.induction_circuit(
            p.model,
            start=p.bos_id if p.bos_id is not None else low,
            low=low,
            half=args.half,
            sequences=args.sequences,
            seed=args.seed,
            progress=progress,
        )
        text, draw = C.format_induction(r), C.plot_induction
        title = (
            f"{p.name}: the induction circuit (K-composition), {args.sequences} sequences of 2 x {args.half} "
            "random tokens"
        )
    else:
        r = C.ioi(p, pairs=args.pairs, seed=args.seed, progress=progress)
        text, draw = C.format_ioi(r), C.plot_ioi
        title = f"{p.name}: indirect object identification, {args.pairs} prompts (clean -> S2 replaced)"
    result = {"circuit": args.task, "model": str(args.model), **r}
    with Publish(Path(args.out), "circuit", overwrite=args.overwrite, sources=(args.model,)) as folder:
        atomic_write_json(folder / "circuit.json", result)
        draw(r, folder / "circuit", title)
    print(text)
    print(f"wrote {Path(args.out) / 'circuit.json'} and circuit.png")
    return 0


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    from .args import _count

    pa = sub.add_parser(
        "patch",
        help="activation patching of every head of a causal LM, an HF masked LM or sequence-to-sequence folder "
        "(clean -> corrupted), with attribution patching beside it; heat map + JSON",
    )
    pa.add_argument(
        "model",
        help="smollm2, a .gguf file, an HF folder (causal LM; masked LM: the answer at the mask token; "
        "sequence-to-sequence: the decoder's next token), or a causal LM pretraining run",
    )
    pa.add_argument("--clean", default=None, help="the clean prompt")
    pa.add_argument("--corrupt", default=None, help="the corrupted prompt (same number of tokens)")
    pa.add_argument("--answer", default=None, help='the token the clean prompt should predict, e.g. " Mary"')
    pa.add_argument("--wrong", default=None, help='logit-diff: the competing token, e.g. " John"')
    pa.add_argument("--file", default=None, help="pairs.jsonl: one {clean, corrupt, answer, wrong} per line")
    pa.add_argument("--metric", choices=["logit-diff", "prob"], default="logit-diff")
    pa.add_argument("--positions", action="store_true", help="patch every head at every position separately")
    pa.add_argument(
        "--decoder",
        default=None,
        help="sequence-to-sequence folders: the output's tokens before the answer (default none: the first token)",
    )
    pa.add_argument("--batch", type=_count, default=32, help="rows per patched forward pass")
    pa.add_argument("--out", required=True, help="folder for importance-patching.json, the heat map and a page")
    pa.add_argument("--overwrite", action="store_true")
    pa.set_defaults(fn=cmd_patch)

    at = sub.add_parser(
        "attribute",
        help="direct logit attribution: what each head and MLP writes to the next token's logit (difference)",
    )
    at.add_argument("model", help="smollm2, a .gguf file, an HF folder, or a causal LM pretraining run")
    at.add_argument("text", help="the prompt")
    at.add_argument("--answer", required=True, help='the next token to explain, e.g. " Paris"')
    at.add_argument("--wrong", default=None, help="a competing token: attribute the logit difference")
    at.add_argument("--top", type=_count, default=10, help="heads listed")
    at.add_argument("--json", action="store_true")
    at.set_defaults(fn=cmd_attribute)

    ci = sub.add_parser(
        "circuit",
        help="look for a circuit of the literature in a pretrained LM with path and "
        "activation patching: induction (K-composition) or ioi (indirect object "
        "identification)",
    )
    ci.add_argument("task", choices=["induction", "ioi"])
    ci.add_argument("model", help="smollm2, a .gguf file or an HF model folder")
    ci.add_argument("--out", required=True, help="folder for circuit.json and circuit.png")
    ci.add_argument("--half", type=_count, default=32, help="induction: random tokens before the repeat")
    ci.add_argument("--sequences", type=_count, default=4, help="induction: repeated random sequences")
    ci.add_argument("--pairs", type=_count, default=16, help="ioi: prompts (clean and corrupted)")
    ci.add_argument("--seed", type=int, default=0)
    ci.add_argument("--no-progress", action="store_true")
    ci.add_argument("--overwrite", action="store_true")
    ci.set_defaults(fn=cmd_circuit)
