"""``multihead train``, ``pretrain``, ``compare`` and ``sweep``: the command line mapped onto a task's config
(flags < TOML < ``--set``); the task, its run folder and its loop come from :mod:`multihead.train`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import config_options, run_folder_options, _apply_sets, _count, _threads, _ints, _seconds, _set_path


TRAIN_FLAGS = {  # flag -> (config path, type, help)
    "epochs": ("optim.epochs", int, "training epochs"),
    "batch_size": ("optim.batch_size", int, "global batch size"),
    "lr": ("optim.lr", float, "peak learning rate (AdamW)"),
    "weight_decay": ("optim.weight_decay", float, "AdamW weight decay"),
    "warmup": ("optim.warmup", float, "fraction of steps with linear warm-up"),
    "clip": ("optim.clip", float, "max gradient norm (0: off)"),
    "patience": ("optim.patience", int, "early stopping patience in epochs (0: off)"),
    "d_model": ("model.encoder.d_model", int, "model width"),
    "heads": ("model.encoder.num_heads", int, "attention heads"),
    "num_kv_heads": ("model.encoder.num_kv_heads", int, "key/value heads (GQA/MQA)"),
    "layers": ("model.encoder.num_layers", int, "encoder blocks"),
    "d_ff": ("model.encoder.d_ff", int, "feed-forward width"),
    "dropout": ("model.encoder.dropout", float, "residual/FFN/embedding dropout"),
    "backend": (
        "model.encoder.backend",
        str,
        "attention backend: auto (the best capable one for each call), reference, sdpa, memory_efficient, flex, "
        "window, block_sparse, performer or linear_elu (multihead backends describes each)",
    ),
    "norm_first": ("model.encoder.norm_first", lambda s: s.lower() in ("1", "true", "yes"), "pre-LN (true/false)"),
    "positional": ("model.positional", str, "sinusoidal | learned | rope | none"),
    "pooling": ("model.pooling", str, "mean | cls"),
    "max_len": ("data.max_len", int, "tokens per text ([CLS]/[SEP] included)"),
    "vocab_size": ("data.vocab_size", int, "subword vocabulary size (from-scratch runs)"),
    "text_column": ("data.text_column", str, "text column of a user file"),
    "label_column": ("data.label_column", str, "label column of a user file"),
    "limit": (
        "data.limit",
        int,
        "at most N training examples: seeded, stratified by label (validation and test stay whole)",
    ),
    "eval_limit": ("data.eval_limit", int, "at most N examples of validation and of test (default: all of them)"),
    "seed": ("run.seed", int, "training seed"),
    "threads": ("run.threads", int, "torch threads (default: torch's choice)"),
    "device": ("run.device", str, "auto | cpu | cuda"),
    "save_every": ("run.save_every", int, "steps between resumable checkpoints"),
    "init": (
        "pretrained.name",
        str,
        "fine-tune a pretrained encoder: minilm or a BERT-family folder (sets "
        "fine-tuning defaults: lr 1e-4, 3 epochs; flags still win)",
    ),
    "layer_decay": ("pretrained.layer_decay", float, "layer-wise lr decay when fine-tuning (1 = off)"),
}


def train_overrides(args) -> dict:
    """What the command line asks for explicitly: the TOML file, then flags, then ``--set`` (later wins)."""
    from ..train.config import load_toml, merge

    toml = load_toml(args.config) if args.config else {}
    over: dict = {}
    if args.data:
        _set_path(over, "data.name", args.data)
    for flag, (path, _, _) in TRAIN_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            _set_path(over, path, value)
    if args.compile:
        _set_path(over, "run.compile", True)
    if getattr(args, "log", None):
        _set_path(over, "run.log", args.log)
    if args.no_progress:
        _set_path(over, "run.progress", False)
    _apply_sets(over, args.set)
    return merge(toml, over)


def with_preset(section: str, args, explicit: dict) -> dict:
    """``--preset NAME``'s overrides (:mod:`multihead.train.presets`) under what the command line asks for."""
    from ..train import presets
    from ..train.config import merge

    data = (explicit.get("data") or {}).get("name", "")
    return merge(presets.preset(section, getattr(args, "preset", None), data), explicit)


def train_config_from_args(args):
    """The command line's config: :func:`multihead.train.config.layered` over what it asks for explicitly."""
    from ..train.config import layered

    return layered(train_overrides(args))


def cmd_train(args) -> int:
    """``multihead train``: the task is the data's (``--data cmudict``: G2P, images: the ViT, ``*_qa``: grounding,
    anything else: text classification) or, on ``--resume`` without ``--data``, the recorded run's."""
    from ..loading import task_of
    from ..train import tasks

    kind = (
        tasks.for_data(args.data) if args.data else (task_of(args.out) if args.resume else None) or tasks.KINDS["train"]
    )
    given = with_preset(kind.section, args, train_overrides(args))
    config = kind.config_from_overrides(given)  # validated before anything is read or written
    results = kind.run(config, Path(args.out), resume=args.resume, overwrite=args.overwrite, given=given)
    if results:  # rank 0 (other ranks of a torchrun job write nothing and return no results)
        for line in kind.task_class().summary(results):
            print(line)
        print(f"run folder: {args.out}")
    return 0


PRETRAIN_FLAGS = {  # flag -> (config path, type, help)
    "objective": ("objective.name", str, "mlm (masked-language model, BERT) | clm (causal LM, GPT)"),
    "text_column": ("data.text_column", str, "text column of a .csv/.tsv/.jsonl file"),
    "steps": ("optim.steps", int, "optimizer steps"),
    "batch_size": ("optim.batch_size", int, "rows per step (global)"),
    "lr": ("optim.lr", float, "peak learning rate (AdamW)"),
    "warmup": ("optim.warmup", float, "fraction of steps with linear warm-up (then linear decay to 0)"),
    "seq_len": ("data.seq_len", int, "tokens per packed row"),
    "vocab_size": ("data.vocab_size", int, "BPE vocabulary trained on the pretraining text"),
    "d_model": ("model.encoder.d_model", int, "model width"),
    "heads": ("model.encoder.num_heads", int, "attention heads"),
    "layers": ("model.encoder.num_layers", int, "encoder blocks"),
    "d_ff": ("model.encoder.d_ff", int, "feed-forward width"),
    "dropout": ("model.encoder.dropout", float, "residual/FFN/embedding dropout"),
    "mask_prob": ("objective.mask_prob", float, "share of tokens selected for prediction (BERT: 0.15)"),
    "limit": ("data.limit", int, "at most N texts read, a seeded sample, before the held-out split (quick runs)"),
    "seed": ("run.seed", int, "seed of the masks, the row order and the initial weights"),
    "threads": ("run.threads", int, "torch threads (default: torch's choice)"),
    "save_every": ("run.save_every", int, "steps between resumable checkpoints"),
    "eval_every": ("run.eval_every", int, "steps between validations"),
}


def cmd_pretrain(args) -> int:
    """``multihead pretrain``: self-supervised pretraining (multihead.train.pretrain)."""
    from ..train.config import load_toml, merge
    from ..train.pretrain import config_from_overrides, pretrain

    over: dict = load_toml(args.config) if args.config else {}
    flags: dict = {}
    if args.data:
        _set_path(flags, "data.name", args.data)
    for flag, (path, _, _) in PRETRAIN_FLAGS.items():
        if getattr(args, flag) is not None:
            _set_path(flags, path, getattr(args, flag))
    if args.whole_word:
        _set_path(flags, "objective.whole_word", True)
    if args.no_progress:
        _set_path(flags, "run.progress", False)
    if args.log:
        _set_path(flags, "run.log", args.log)
    _apply_sets(flags, args.set)
    explicit = with_preset("pretrain", args, merge(over, flags))
    config = config_from_overrides(explicit)  # validated before any work
    r = pretrain(config, Path(args.out), resume=args.resume, overwrite=args.overwrite, given=explicit)
    if r:
        v = r["validation"]
        print(
            f"{r['objective']} on {r['data']}: {r['steps']} steps, {r['tokens'] / 1e6:.1f}M tokens "
            f"({r['passes']:.2f} passes) in {r['minutes']:.1f} min; validation loss {v['loss']:.4f}, perplexity "
            f"{v['perplexity']:.1f}, {'masked' if r['objective'] == 'mlm' else 'next-token'} accuracy "
            f"{v['accuracy']:.4f}"
        )
        if r["encoder"]:
            print(f"encoder: {r['encoder']} (fine-tune it: multihead train --init {args.out} --data rotten_tomatoes)")
        else:
            print(f'generate from it: multihead generate {args.out} "This movie was" --max-new 50')
        print(f"run folder: {args.out}")
    return 0


def cmd_compare(args) -> int:
    """``multihead compare``: the attention variants trained and measured side by side (multihead.train.compare)."""
    from .._io import check_target
    from ..train.compare import format_table, parse_variants, run_compare

    variants = parse_variants(args.variants)
    seeds = list(range(args.seeds))
    out = Path(args.out)
    if (
        out.exists()
        and any(out.iterdir())
        and not (out / "compare.json").exists()
        and not any((out / f"{v}-s{s}").exists() for v in variants for s in seeds)
    ):
        check_target(out, "compare", overwrite=args.overwrite, sources=())
    size = {
        k: v
        for k, v in (
            ("d_model", args.d_model),
            ("num_heads", args.heads),
            ("num_layers", args.layers),
            ("d_ff", args.d_ff),
        )
        if v is not None
    }
    data_options = {k: v for k, v in (("limit", args.limit), ("vocab_size", args.vocab_size)) if v is not None}
    payload = run_compare(
        data=args.data,
        variants=variants,
        seeds=seeds,
        out=out,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        threads=args.threads,
        size=size,
        data_options=data_options,
        match_params=not args.no_match_params,
        overwrite=args.overwrite,
    )
    print(format_table(payload))
    print(f"wrote {out / 'compare.json'} and {out / 'compare.png'}")
    return 0


def cmd_sweep(args) -> int:
    from ..heads import sweep as S

    flags = argparse.Namespace(**vars(args))
    flags.heads = flags.init = flags.layer_decay = None  # the sweep sets the heads; it trains from scratch
    config = train_config_from_args(flags)
    config.run.progress = False
    summary = S.sweep(
        config,
        Path(args.out),
        heads=args.heads if args.kv_heads is None else None,
        kv_heads=args.kv_heads,
        seeds=args.seeds,
        min_time=args.min_time,
        overwrite=args.overwrite,
    )
    print(S.format_table(summary))
    print(f"wrote {Path(args.out) / 'sweep.json'} and sweep.png")
    return 0


def preset_option(p) -> None:
    from ..train import presets

    p.add_argument(
        "--preset",
        choices=sorted({n for s in presets.PRESETS.values() for n in s}),
        default=None,
        help="a named recipe under your flags: " + presets.describe(),
    )


def _parser_train(sub) -> None:
    t = sub.add_parser(
        "train",
        help="train a Transformer text classifier (or, with --data cmudict, a "
        "grapheme-to-phoneme encoder-decoder; with --data fashion_mnist or digits, a "
        "Vision Transformer); writes a run folder",
    )
    t.add_argument(
        "--data",
        default=None,
        help="built-in dataset (rotten_tomatoes, imdb, bbc_news, bbc_headlines), "
        "a .csv/.tsv/.jsonl file (default rotten_tomatoes), cmudict "
        "(grapheme-to-phoneme), or fashion_mnist / digits (images, ViT: "
        "patch 4 by default, i.e. 49 patches of a 28x28 image and 4 of an 8x8 "
        "digit; the demo trains digits with --set model.patch_size=2, 16 "
        "patches)",
    )
    config_options(t, TRAIN_FLAGS, "[data], [model], [model.encoder], [optim], [run], [pretrained]")
    preset_option(t)
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    run_folder_options(t)
    t.set_defaults(fn=cmd_train)


def _parser_pretrain(sub) -> None:
    pt = sub.add_parser(
        "pretrain",
        help="self-supervised pretraining on unlabelled text: a masked LM (whose encoder `train --init` "
        "fine-tunes) or, with --objective clm, a causal LM; writes a run folder",
    )
    pt.add_argument(
        "--data",
        default=None,
        help="built-in dataset whose texts are used (default imdb; labels are "
        "never read), a .txt file (one text per line) or .csv/.tsv/.jsonl",
    )
    config_options(pt, PRETRAIN_FLAGS, "[data], [objective], [model], [optim], [run]")
    preset_option(pt)
    pt.add_argument("--whole-word", action="store_true", help="mask whole words (all pieces of a selected word)")
    run_folder_options(pt)
    pt.set_defaults(fn=cmd_pretrain)


def _parser_compare(sub) -> None:
    cp = sub.add_parser(
        "compare",
        help="attention variants (MHA, GQA, MLA, gated, sinks, differential, ALiBi, "
        "talking heads) trained and measured side by side on one causal LM",
    )
    cp.add_argument("--data", default="imdb", help="texts to pretrain on (built-in or a file)")
    from ..train.compare import VARIANTS

    cp.add_argument(
        "--variants",
        default="mha,gqa,mla,gated,sinks,diff,alibi",
        help="comma-separated variants, from: " + "; ".join(f"{k} ({v[2]})" for k, v in VARIANTS.items()),
    )
    cp.add_argument("--seeds", type=_count, default=3, help="seeds per variant (0..N-1)")
    cp.add_argument("--steps", type=_count, default=600, help="optimizer steps per run")
    cp.add_argument("--batch-size", type=_count, default=32)
    cp.add_argument("--seq-len", type=_count, default=128, help="tokens per row (the trained length)")
    cp.add_argument("--lr", type=float, default=2e-3)
    cp.add_argument("--d-model", type=_count, default=None)
    cp.add_argument("--heads", type=_count, default=None)
    cp.add_argument("--layers", type=_count, default=None)
    cp.add_argument(
        "--d-ff", type=_count, default=None, help="the baseline's FFN width (others matched to its parameter count)"
    )
    cp.add_argument(
        "--no-match-params",
        action="store_true",
        help="one FFN width for every variant instead of matching the baseline's parameter count",
    )
    cp.add_argument("--vocab-size", type=_count, default=None)
    cp.add_argument("--limit", type=_count, default=None, help="use N texts (smoke tests)")
    cp.add_argument("--threads", type=_threads, default=None)
    cp.add_argument("--out", required=True, help="folder for one run per variant x seed and compare.json/.png")
    cp.add_argument("--overwrite", action="store_true")
    cp.set_defaults(fn=cmd_compare)


def _parser_sweep(sub) -> None:
    sw = sub.add_parser("sweep", help="train one model per head count (fixed d_model) and seed; table, JSON, PNG")
    sw.add_argument("--data", default=None, help="dataset (default rotten_tomatoes)")
    sw.add_argument("--out", required=True, help="folder for the runs and sweep.json")
    sw.add_argument("--heads", type=_ints, default=[1, 2, 4, 8, 16], help="head counts (default 1,2,4,8,16)")
    sw.add_argument(
        "--kv-heads",
        type=_ints,
        default=None,
        help="sweep key/value heads instead, at --set model.encoder.num_heads=H (MHA/GQA/MQA)",
    )
    sw.add_argument("--seeds", type=_count, default=3)
    sw.add_argument("--min-time", type=_seconds, default=2.0, help="seconds of inference timing per model")
    sw.add_argument("--config", default=None, help="TOML train config (as for train)")
    for flag, (_, typ, help_) in TRAIN_FLAGS.items():
        if flag not in ("heads", "init", "layer_decay", "seed"):
            sw.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None, help=help_)
    sw.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="any other config field")
    sw.add_argument("--overwrite", action="store_true", help="write into a folder of other files at --out")
    sw.set_defaults(fn=cmd_sweep, compile=False, no_progress=True, seed=None)


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    _parser_train(sub)
    _parser_pretrain(sub)
    _parser_compare(sub)
    _parser_sweep(sub)
