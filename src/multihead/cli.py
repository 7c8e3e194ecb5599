"""The ``multihead`` command. It parses arguments and calls library functions; everything is callable from Python."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _number(kind: type, lo: float, hi: float, what: str):
    """An argparse type for a number in ``[lo, hi]``: bad values are refused at parse time, before any work."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not lo <= value <= hi:  # NaN fails too
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_count = _number(int, 1, float("inf"), "a positive integer")  # batch sizes, thread counts, N, epochs
_nonneg = _number(int, 0, float("inf"), "an integer >= 0")  # counts where 0 means none / all
_fraction = _number(float, 0.0, 1.0, "a number in [0, 1]")
_seconds = _number(float, 0.0, 1e9, "seconds (a finite number >= 0)")


def _words(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def cmd_demo(args) -> int:
    from .demo import run_demo, walkthrough

    if args.walkthrough_only:
        walkthrough(Path(args.out), seed=args.seed)
    else:
        run_demo(Path(args.out), seed=args.seed, limit=args.limit, epochs=args.epochs)
    return 0


def cmd_backends(args) -> int:
    from .attention import list_backends

    for name, b in sorted(list_backends().items(), key=lambda kv: -kv[1].priority):
        c = b.capabilities
        why = b.available()
        print(f"{name:<17} priority {b.priority:>3}  weights={c.returns_weights} dropout={c.supports_dropout} "
              f"gqa={c.supports_gqa} exact={c.exact} patterns={','.join(c.patterns) or '-'}"
              f"{' (only)' if c.requires_pattern else ''}  {b.description}"
              + (f"  [unavailable: {why}]" if why else ""))
    import torch

    from .attention.registry import CallInfo, resolve

    picks = []
    for what, pattern in (("a sliding window", "window"), ("BigBird blocks", "block"), ("a dense call", None)):
        per_device = []
        for device in ("cpu", "cuda"):
            call = CallInfo(device=device, dtype=torch.float32, need_weights=False, dropout_p=0.0, gqa=False,
                            mask_parts=frozenset({pattern} if pattern else ()), pattern=pattern)
            try:
                per_device.append(f"{resolve('auto', call).name} on {device}")
            except RuntimeError:
                per_device.append(f"nothing on {device}")
        picks.append(f"{what}: {', '.join(per_device)}")
    print("auto picks (mh.explain_choice says why for a real call): " + "; ".join(picks))
    return 0


def cmd_bench(args) -> int:
    from .bench import check_device_flags, suite as bench_suite

    check_device_flags(args.suite, args.device, args.dtype)
    suite = bench_suite(args.suite)
    out = Path(args.out) if args.out else suite.default_out()
    payload = suite.from_args(args, out)
    print(suite.format_table(payload))
    png = out.with_suffix(".png")
    print(f"wrote {out}" + (f" and {png}" if png.exists() else ""))
    return 0


# ------------------------------------------------------------------------------------------------ text classification
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
    "backend": ("model.encoder.backend", str, "attention backend (auto, sdpa, reference, ...)"),
    "norm_first": ("model.encoder.norm_first", lambda s: s.lower() in ("1", "true", "yes"), "pre-LN (true/false)"),
    "positional": ("model.positional", str, "sinusoidal | learned | rope | none"),
    "pooling": ("model.pooling", str, "mean | cls"),
    "max_len": ("data.max_len", int, "tokens per text ([CLS]/[SEP] included)"),
    "vocab_size": ("data.vocab_size", int, "subword vocabulary size (from-scratch runs)"),
    "text_column": ("data.text_column", str, "text column of a user file"),
    "label_column": ("data.label_column", str, "label column of a user file"),
    "limit": ("data.limit", int, "use N examples per split (smoke tests)"),
    "seed": ("run.seed", int, "training seed"),
    "threads": ("run.threads", int, "torch threads (default: torch's choice)"),
    "device": ("run.device", str, "auto | cpu | cuda"),
    "save_every": ("run.save_every", int, "steps between resumable checkpoints"),
    "init": ("pretrained.name", str, "fine-tune a pretrained encoder: minilm or a BERT-family folder (sets "
                                     "fine-tuning defaults: lr 1e-4, 3 epochs; flags still win)"),
    "layer_decay": ("pretrained.layer_decay", float, "layer-wise lr decay when fine-tuning (1 = off)"),
}


def _set_path(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def _parse_value(text: str):
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _apply_sets(d: dict, items: list[str] | None) -> None:
    """``--set section.key=value`` (repeatable; the value parsed as JSON when it is JSON) into ``d``."""
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"--set expects section.key=value, e.g. --set optim.lr=3e-4; got {item!r}")
        key, value = item.split("=", 1)
        _set_path(d, key.strip(), _parse_value(value))


def train_overrides(args) -> dict:
    """What the command line asks for explicitly: the TOML file, then flags, then ``--set`` (later wins)."""
    from .train.config import load_toml, merge

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
    if args.no_progress:
        _set_path(over, "run.progress", False)
    _apply_sets(over, args.set)
    return merge(toml, over)


def train_config_from_args(args):
    """The command line's config: :func:`multihead.train.config.layered` over what it asks for explicitly."""
    from .train.config import layered

    return layered(train_overrides(args))


def cmd_train(args) -> int:
    """``multihead train``: the task is the data's (``--data cmudict``: G2P, images: the ViT, ``*_qa``: grounding,
    anything else: text classification) or, on ``--resume`` without ``--data``, the recorded run's."""
    from .train import tasks

    kind = tasks.for_data(args.data) if args.data else (
        tasks.kind_of(args.out) if args.resume else None) or tasks.KINDS["train"]
    given = train_overrides(args)
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
    "limit": ("data.limit", int, "use N texts (smoke tests)"),
    "seed": ("run.seed", int, "seed of the masks, the row order and the initial weights"),
    "threads": ("run.threads", int, "torch threads (default: torch's choice)"),
    "save_every": ("run.save_every", int, "steps between resumable checkpoints"),
    "eval_every": ("run.eval_every", int, "steps between validations"),
}


def cmd_pretrain(args) -> int:
    """``multihead pretrain``: self-supervised pretraining (multihead.train.pretrain)."""
    from .train.config import load_toml, merge
    from .train.pretrain import config_from_overrides, pretrain

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
    _apply_sets(flags, args.set)
    explicit = merge(over, flags)
    config = config_from_overrides(explicit)  # validated before any work
    r = pretrain(config, Path(args.out), resume=args.resume, overwrite=args.overwrite, given=explicit)
    if r:
        v = r["validation"]
        print(f"{r['objective']} on {r['data']}: {r['steps']} steps, {r['tokens'] / 1e6:.1f}M tokens "
              f"({r['passes']:.2f} passes) in {r['minutes']:.1f} min; validation loss {v['loss']:.4f}, perplexity "
              f"{v['perplexity']:.1f}, masked accuracy {v['accuracy']:.4f}")
        if r["encoder"]:
            print(f"encoder: {r['encoder']} (fine-tune it: multihead train --init {args.out} --data rotten_tomatoes)")
        else:
            print(f"generate from it: multihead generate {args.out} \"This movie was\" --max-new 50")
        print(f"run folder: {args.out}")
    return 0


def cmd_generate(args) -> int:
    """``multihead generate RUN "prompt"``: continue a prompt with a causal LM run, streaming tokens (KV cache)."""
    import sys

    import torch

    from .data.tokenizer import SEP
    from .models.generation import generate
    from .train.pretrain import load_pretrain_run

    run = load_pretrain_run(args.run)
    if run.config.objective.name != "clm":
        raise ValueError(f"{args.run} is a {run.config.objective.name} run; generation needs a causal LM: "
                         "multihead pretrain --objective clm")
    tok, positions = run.tokenizer, run.config.causal.max_len
    sep = tok.token_to_id(SEP)
    ids = [sep, *tok.encode(args.prompt, add_special_tokens=False).ids]  # [SEP] = the start of a new text
    if len(ids) + args.max_new > positions:
        raise ValueError(f"the prompt ({len(ids)} tokens with the start marker) plus --max-new {args.max_new} exceeds "
                         f"the model's {positions} positions; use --max-new {max(1, positions - len(ids))} or less, or "
                         "a shorter prompt")
    if args.threads:
        torch.set_num_threads(args.threads)
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
            sys.stdout.write(text[len(shown[0]):] if text.startswith(shown[0]) else "\n" + text)
            sys.stdout.flush()
        shown[0] = text

    options = dict(strategy="sample" if args.sample else "greedy", max_new_tokens=args.max_new, stop_tokens=(sep,),
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    generate(run.model, torch.tensor([ids]), None, streamer=stream, **options)
    if not args.stream:
        sys.stdout.write(shown[0][len(tok.decode(ids[1:])):])
    sys.stdout.write("\n")
    return 0


def cmd_evaluate(args) -> int:
    from .train import tasks

    kind = tasks.require(args.run, "evaluate")
    return {"train": _evaluate_text, "g2p": _evaluate_g2p, "vision": _evaluate_vision,
            "grounding": _evaluate_grounding, "pretrain": _evaluate_lm}[kind.section](args)


def _evaluate_text(args) -> int:
    import json

    from .train import evaluate, load_run

    run = load_run(args.run)
    r = evaluate(run, args.data, split=args.split, text_column=args.text_column, label_column=args.label_column)
    if args.json:
        print(json.dumps({k: r[k] for k in ("dataset", "split", "accuracy", "macro_f1", "loss", "n", "confusion",
                                            "labels", "truncated")}))
    else:
        print(f"{r['dataset']} [{r['split']}]: accuracy {r['accuracy']:.4f}, macro-F1 {r['macro_f1']:.4f}, "
              f"loss {r['loss']:.4f}, n={r['n']}")
        print("confusion (rows true, columns predicted): " + ", ".join(r["labels"]))
        for name, row in zip(r["labels"], r["confusion"]):
            print(f"  {name:<16} " + " ".join(f"{v:>6}" for v in row))
    return 0


def _evaluate_g2p(args) -> int:
    import json

    from .train.g2p import evaluate_run, load_g2p_run

    r = evaluate_run(load_g2p_run(args.run), args.split, beam=args.beam)
    if args.json:
        print(json.dumps(r))
    else:
        how = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        print(f"cmudict [{r['split']}], {how}: word error rate {r['wer']:.4f}, phoneme error rate "
              f"{r['per']:.4f} (n={r['words']} words)")
    return 0


def _evaluate_grounding(args) -> int:
    """``multihead evaluate runs/qa``: accuracy on the held-out test canvases, per question kind."""
    import json

    from .train.grounding import evaluate_run, load_grounding_run

    if args.split != "test":
        raise ValueError(f"a grounding run is scored on its held-out test canvases; drop --split {args.split}")
    r = evaluate_run(load_grounding_run(args.run))
    if args.json:
        print(json.dumps(r))
    else:
        kinds = ", ".join(f"{k} {v:.4f}" for k, v in r["by_kind"].items())
        print(f"{r['dataset']} [test canvases]: accuracy {r['accuracy']:.4f} ({kinds}), loss {r['loss']:.4f}, "
              f"n={r['n']}")
    return 0


def _evaluate_lm(args) -> int:
    """``multihead evaluate runs/lm``: loss and perplexity on the run's held-out texts."""
    import json

    from .train.pretrain import evaluate_run, load_pretrain_run

    r = evaluate_run(load_pretrain_run(args.run))
    if args.json:
        print(json.dumps(r))
    else:
        what = "masked" if r["objective"] == "mlm" else "next-token"
        print(f"{r['data']} [held-out texts, {r['objective']}]: loss {r['loss']:.4f}, perplexity "
              f"{r['perplexity']:.1f}, {what} accuracy {r['accuracy']:.4f} (n={r['tokens']} tokens)")
    return 0


def _evaluate_vision(args) -> int:
    import json

    from .data.images import load_images
    from .train.vision import evaluate_images, load_vision_run

    run = load_vision_run(args.run)
    dc = run.config.data
    splits = load_images(dc.name, path=dc.path, seed=dc.split_seed)
    if args.split not in ("train", "validation", "test"):
        raise ValueError(f"--split must be train, validation or test for an image run, got {args.split!r}")
    r = evaluate_images(run.model, *getattr(splits, args.split))
    if args.json:
        print(json.dumps({"dataset": dc.name, "split": args.split, **{k: r[k] for k in (
            "accuracy", "macro_f1", "loss", "n", "confusion")}, "labels": run.labels}))
    else:
        print(f"{dc.name} [{args.split}]: accuracy {r['accuracy']:.4f}, macro-F1 {r['macro_f1']:.4f}, "
              f"loss {r['loss']:.4f}, n={r['n']}")
    return 0


def _predict_vision(args) -> int:
    """``multihead predict RUN --index 17`` (a test image) or ``--image x.png|x.npy``: class probabilities."""
    import json

    from .train.vision import held_out_images, load_vision_run, predict_images, read_image

    run = load_vision_run(args.run)
    items = []
    if args.index is not None:
        images, labels = held_out_images(run)
        if not 0 <= args.index < len(labels):
            raise ValueError(f"--index {args.index} is outside the test split (0..{len(labels) - 1})")
        items.append((f"test[{args.index}]", images[args.index:args.index + 1], run.labels[int(labels[args.index])]))
    for path in args.image or []:
        items.append((path, read_image(path, run.model.config), None))
    if not items:
        raise ValueError("nothing to predict: pass --index N (a test image) or --image FILE.png|.npy")
    for name, image, truth in items:
        probs = predict_images(run.model, image)[0]
        top = probs.argsort(descending=True)[:3].tolist()
        row = {"image": name, "label": run.labels[top[0]], "probability": round(float(probs[top[0]]), 4),
               "top3": {run.labels[i]: round(float(probs[i]), 4) for i in top}}
        if truth is not None:
            row["true"] = truth
        print(json.dumps(row))
    return 0


def cmd_predict(args) -> int:
    from .train import tasks

    kind = tasks.require(args.run, "predict")
    return {"train": _predict_text, "g2p": _predict_g2p, "vision": _predict_vision}[kind.section](args)


def _predict_text(args) -> int:
    import json

    from .train import load_run, predict

    texts = _read_texts(args.texts, args.file)
    if not texts:
        raise ValueError("nothing to predict: pass texts as arguments or --file FILE (one text per line, or .jsonl)")
    for row in predict(load_run(args.run), texts):
        print(json.dumps(row, ensure_ascii=False))
    return 0


def _predict_g2p(args) -> int:
    from .train.g2p import load_g2p_run, predict_words

    words = _read_texts(args.texts, args.file)
    if not words:
        raise ValueError("nothing to predict: pass words as arguments or --file FILE (one word per line)")
    for row in predict_words(load_g2p_run(args.run), words, beam=args.beam):
        print(f"{row['word']}\t{row['phonemes']}")
    return 0


def cmd_data(args) -> int:
    import json

    from . import data as D

    ds = D.load(args.name, text_column=args.text_column, label_column=args.label_column)
    info = D.card(ds, D.split(ds, seed=args.seed))
    print(json.dumps(info, indent=2) if args.json else D.format_card(info))
    return 0


# ------------------------------------------------------------------------------------------------ pretrained encoders
def _read_texts(texts: list[str], file: str | None) -> list[str]:
    from .data import read_texts

    return list(texts) + (read_texts(file) if file else [])


def cmd_embed(args) -> int:
    import json

    from .loading import load
    from .pretrained import embed_texts

    texts = _read_texts(args.texts, args.file)
    if not texts:
        raise ValueError("nothing to embed: pass texts as arguments or --file FILE (one text per line, or .jsonl)")
    s = load(args.model)
    vectors = embed_texts(s.model, s.tokenizer, texts, s.sentence_max_len, batch_size=args.batch_size,
                          progress=len(texts) > 4 * args.batch_size)
    if args.out:
        from .train.runfolder import atomic_write_bytes

        lines = "".join(json.dumps({"text": t, "embedding": [round(x, 7) for x in v]}, ensure_ascii=False) + "\n"
                        for t, v in zip(texts, vectors.tolist()))
        atomic_write_bytes(Path(args.out), lines.encode())
        print(f"wrote {len(texts)} embeddings of dimension {vectors.shape[1]} to {args.out}")
    else:
        print(f"{len(texts)} embeddings of dimension {vectors.shape[1]} (mean pooling, L2-normalised)")
    if len(texts) <= 12:
        sims = vectors @ vectors.T  # (N, N) cosine similarities of unit vectors
        width = max(len(t[:40]) for t in texts)
        print("cosine similarity:")
        for i, t in enumerate(texts):
            print(f"  [{i}] {t[:40]:<{width}} " + " ".join(f"{v:6.3f}" for v in sims[i].tolist()))
    return 0


def cmd_export(args) -> int:
    from . import pretrained
    from .loading import load

    from ._io import check_target

    check_target(args.out, "hf", overwrite=args.overwrite, sources=(args.source,))  # before loading anything
    s = load(args.source)
    out = pretrained.export(s.model, s.tokenizer, args.out, overwrite=args.overwrite, sources=(args.source,))
    print(f"wrote an HF BertModel folder to {out} (config.json, model.safetensors, tokenizer.json, vocab.txt); "
          "load it with transformers.BertModel.from_pretrained")
    return 0


# ------------------------------------------------------------------------------------------------ seeing inside
def _head_list(text: str) -> list[tuple[int, int]]:
    out = []
    for item in _words(text):
        try:
            l, h = item.split(":")
            out.append((int(l), int(h)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LAYER:HEAD pairs like 1:8,5:3, got {item!r}") from None
    return out


def cmd_show(args) -> int:
    from ._io import check_target
    from .interpret import load_subject
    from .interpret.show import show
    from .train import tasks

    kind = tasks.kind_of(args.model)
    if kind is not None:
        handler = {"vision": _show_vision, "grounding": _show_grounding, "g2p": _show_g2p}.get(
            kind.check("show", args.model).section)
        if handler is not None:
            return handler(args)
    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write the pictures and the page")
    check_target(args.out, "show", overwrite=args.overwrite, sources=(args.model,))
    if not args.text.strip():
        raise ValueError("the text to show is empty; pass a sentence, e.g. \"The cat sat on the mat.\"")
    subject = load_subject(args.model)
    if args.max_len:
        _lift_max_len(subject, args.max_len)
    summary = show(subject, args.text, Path(args.out), heads=args.heads, rollout=not args.no_rollout,
                   overwrite=args.overwrite)
    print(f"{len(summary['tokens'])} tokens: {' '.join(summary['tokens'][:40])}"
          f"{' ...' if len(summary['tokens']) > 40 else ''}")
    print(f"wrote {len(summary['files'])} files to {args.out} in {summary['seconds']['total']:.1f}s; open "
          f"{Path(args.out) / 'attention.html'} in a browser (works offline)")
    return 0


def _show_vision(args) -> int:
    """``multihead show runs/vit --index 17`` / ``--image x.png``: attention over the image, rollout, one patch's
    view, and the mean attention distance per head over 1,000 test images."""
    from ._io import Publish, atomic_write_json, check_target
    from .interpret.vision import attention_distance, plot_distance, show_image
    from .train.vision import held_out_images, load_vision_run, read_image

    if (args.index is None) == (args.image is None):
        raise ValueError("pass one image: --index N (a test image) or --image FILE.png|.npy")
    patch = None
    if args.patch:
        try:
            patch = tuple(int(v) for v in args.patch.split(","))
            assert len(patch) == 2
        except (ValueError, AssertionError):
            raise ValueError(f"--patch takes ROW,COL (e.g. 3,3), got {args.patch!r}") from None
    name = f"test-{args.index}" if args.index is not None else Path(args.image).stem
    out = Path(args.out) if args.out else Path(args.model) / "show" / name
    check_target(out, "show", overwrite=args.overwrite, sources=(args.model,))
    run = load_vision_run(args.model)
    images, labels = held_out_images(run)
    truth = None
    if args.index is not None:
        if not 0 <= args.index < len(labels):
            raise ValueError(f"--index {args.index} is outside the test split (0..{len(labels) - 1})")
        image, truth = images[args.index:args.index + 1], run.labels[int(labels[args.index])]
    else:
        image = read_image(args.image, run.model.config)
    with Publish(out, "show", overwrite=args.overwrite, sources=(args.model,), check=False) as folder:
        summary = show_image(run.model, image, run.labels, folder, truth=truth, patch=patch, name=name)
        sample = images[:1000]
        dist = attention_distance(run.model, sample)
        summary["files"] += [str(f.relative_to(folder)) for f in plot_distance(
            dist, run.model, folder / "distance", f"mean attention distance, {len(sample)} test images")]
        summary["mean_attention_distance"] = [d.tolist() for d in dist]
        atomic_write_json(folder / "image.json", summary)
    print(f"{name}: predicted {summary['predicted']}" + (f" (true {truth})" if truth else ""))
    print("mean attention distance (pixels) per layer: " + "; ".join(
        " ".join(f"{v:.1f}" for v in d) for d in summary["mean_attention_distance"]))
    print(f"wrote {len(summary['files'])} files to {out}")
    return 0


def _show_grounding(args) -> int:
    """``multihead show runs/qa --index 3 [--question "where is the bag?"]``: a test canvas, the model's answer, and each
    cross-attention head's attention of the question over the canvas."""
    import torch

    from ._io import Publish, atomic_write_json, check_target
    from .interpret.vision import show_grounding
    from .train.grounding import load_grounding_run, test_canvases

    if args.index is None or args.image is not None:
        raise ValueError("pass --index N (a held-out test canvas) and optionally --question \"where is the bag?\" "
                         "(default: the canvas's own question)")
    out = Path(args.out) if args.out else Path(args.model) / "show" / f"canvas-{args.index}"
    check_target(out, "show", overwrite=args.overwrite, sources=(args.model,))
    run = load_grounding_run(args.model)
    vocab = run.vocab
    asked = args.question if args.question is not None else args.text
    question = vocab.parse(asked)[1] if asked.strip() else None  # before the canvases are drawn
    data = test_canvases(run)
    if not args.index < len(data.answers):
        raise ValueError(f"--index {args.index} is outside the test canvases (0..{len(data.answers) - 1})")
    i = args.index
    q = data.questions[i:i + 1] if question is None else torch.tensor([question], dtype=torch.long)
    truth = run.answers[int(data.answers[i])] if question is None else None
    with Publish(out, "show", overwrite=args.overwrite, sources=(args.model,), check=False) as folder:
        summary = show_grounding(run.model, data.canvases[i:i + 1], q, vocab, folder, truth=truth,
                                 name=f"canvas-{i}")
        atomic_write_json(folder / "canvas.json", summary)
    print(f"canvas {i}: {summary['question']} -> {summary['answer']} ({summary['probability']:.2f})"
          + (f"; true {truth}" if truth else ""))
    print(f"wrote {len(summary['files'])} files to {out}")
    return 0


def _show_g2p(args) -> int:
    from .data.g2p import check_word
    from .interpret.g2p import show_g2p
    from .train.g2p import load_g2p_run

    from ._io import check_target

    word = check_word(args.text)  # before anything is loaded or written
    out = Path(args.out) if args.out else Path(args.model) / "show" / word.replace("'", "_")
    check_target(out, "show", overwrite=args.overwrite, sources=(args.model,))
    summary = show_g2p(load_g2p_run(args.model), word, out, overwrite=args.overwrite)
    print(f"wrote {len(summary['files'])} files to {out}; open {out / 'cross.html'} in a browser (works offline)")
    return 0


def cmd_compare(args) -> int:
    """``multihead compare``: the attention variants trained and measured side by side (multihead.train.compare)."""
    from ._io import check_target
    from .train.compare import format_table, parse_variants, run_compare

    variants = parse_variants(args.variants)
    seeds = list(range(args.seeds))
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not (out / "compare.json").exists() and not any(
            (out / f"{v}-s{s}").exists() for v in variants for s in seeds):
        check_target(out, "compare", overwrite=args.overwrite, sources=())
    size = {k: v for k, v in (("d_model", args.d_model), ("num_heads", args.heads), ("num_layers", args.layers),
                              ("d_ff", args.d_ff)) if v is not None}
    data_options = {k: v for k, v in (("limit", args.limit), ("vocab_size", args.vocab_size)) if v is not None}
    payload = run_compare(data=args.data, variants=variants, seeds=seeds, out=out, steps=args.steps,
                          batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, threads=args.threads,
                          size=size, data_options=data_options, match_params=not args.no_match_params,
                          overwrite=args.overwrite)
    print(format_table(payload))
    print(f"wrote {out / 'compare.json'} and {out / 'compare.png'}")
    return 0


def cmd_heads(args) -> int:
    import json

    from . import data as D
    from .interpret import load_subject, roles

    if args.out:
        from ._io import check_target

        check_target(args.out, "heads", overwrite=args.overwrite, sources=(args.model,))
    from .train import tasks

    kind = tasks.kind_of(args.model)
    if kind is not None and kind.check("heads", args.model).section == "pretrain":
        return _heads_causal(args)
    import resource
    import time

    from .interpret.roles import subject_head_stats

    subject = load_subject(args.model)
    if args.max_len:
        _lift_max_len(subject, args.max_len)
    ds = D.load(args.data, text_column=args.text_column, label_column=args.label_column)
    pool = D.split(ds, seed=0).test.texts if args.split == "test" else ds.texts
    texts = _concatenated(subject, pool, args.n) if args.concat else pool[: args.n]
    source = args.source or ("stats" if subject.max_len > 1024 else "maps")
    t0 = time.perf_counter()
    if source == "maps":
        corpus = subject.maps(texts)
        result = roles.analyse(corpus)
    else:  # exact statistics on the model's own (fused) path: no L x L map is built
        stats, tokens = subject_head_stats(subject, texts, batch_size=1 if subject.max_len > 1024 else 32)
        result = roles.summarise(stats, subject.name, len(texts), tokens, "stats")
    result["data"] = {"name": args.data, "split": args.split, "n": len(texts), "concatenated": bool(args.concat),
                      "max_len": subject.max_len}
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if args.json:
        print(json.dumps(result))
    else:
        print(roles.format_table(result))
    if args.out:
        files = roles.write(result, Path(args.out), overwrite=args.overwrite)
        print(f"wrote {', '.join(str(f) for f in files)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _lift_max_len(subject, max_len: int) -> None:
    """``heads --max-len``: read longer inputs. A learned position table cannot grow (refused with the fix);
    rotary or no positions read any length (beyond the trained length: the analysis says so in its data)."""
    config = getattr(subject.model, "config", None)
    positional = getattr(config, "positional", "learned")
    table = getattr(config, "max_len", subject.max_len)
    if max_len > table and positional == "learned":
        raise ValueError(f"{subject.name} has learned positions for {table} tokens; --max-len {max_len} needs a model "
                         "with rotary positions (e.g. a pretrain run's encoder) or at most " + str(table))
    if config is not None and max_len > table:
        config.max_len = max_len
    subject.max_len = max_len


def _concatenated(subject, texts: list[str], n: int) -> list[str]:
    """``heads --concat``: ``n`` inputs, each consecutive texts joined until the model's ``max_len`` tokens."""
    out, cur, count = [], [], 0
    for t in texts:
        cur.append(t)
        count += len(subject.tokenizer.encode(t, add_special_tokens=False).ids)
        if count >= subject.max_len:
            out.append(" ".join(cur))
            cur, count = [], 0
            if len(out) == n:
                break
    if len(out) < n:
        raise ValueError(f"the data holds {len(out)} inputs of {subject.max_len} tokens; pass a smaller --n or "
                         "--max-len")
    return out


def _heads_causal(args) -> int:
    """``multihead heads RUN`` for a causal LM run: induction heads (prefix matching and copying, stated rules in
    multihead.interpret.induction), on repeated random tokens from the run's own vocabulary."""
    import json

    from ._io import Publish, atomic_write_json
    from .data.tokenizer import SEP, SPECIALS
    from .interpret import induction as I
    from .train.pretrain import load_pretrain_run

    run = load_pretrain_run(args.model)
    if run.config.objective.name != "clm":
        raise ValueError(f"{args.model} is a masked-LM run; its encoder's heads are analysed on text: multihead heads "
                         f"{Path(args.model) / 'encoder'}")
    half = max(2, min(64, (run.config.causal.max_len - 1) // 2))
    scores = I.induction_scores(run.model, half=half, batch=min(args.n, 64), low=len(SPECIALS) + 1,
                                start=run.tokenizer.token_to_id(SEP))
    result = {"model": str(args.model), "rule": f"induction: prefix-matching score >= {I.INDUCTION}",
              "half": half, "prefix_matching": scores["prefix_matching"].tolist(),
              "copying": scores["copying"].tolist(), "roles": I.induction_roles(scores["prefix_matching"]),
              "loss_first_half": scores["loss_first_half"], "loss_second_half": scores["loss_second_half"]}
    print(json.dumps(result) if args.json else I.format_scores(result))
    if args.out:
        with Publish(args.out, "heads", overwrite=args.overwrite, sources=(args.model,)) as folder:
            atomic_write_json(folder / "heads.json", result)
        print(f"wrote {Path(args.out) / 'heads.json'}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_sinks(args) -> int:
    """``multihead sinks RUN``: StreamingLLM's three caches on held-out text longer than the trained rows."""
    import torch

    from ._io import Publish, atomic_write_json, check_target
    from .interpret import streaming as S
    from .train.pretrain import held_out_rows, load_pretrain_run

    if args.out:
        check_target(args.out, "sinks", overwrite=args.overwrite, sources=(args.run,))
    run = load_pretrain_run(args.run)
    if run.config.objective.name != "clm" or run.config.causal.positional != "rope":
        raise ValueError(f"{args.run}: the cache comparison needs a causal LM with rotary positions (positions within "
                         "a window cache); train one with: multihead pretrain --objective clm --set "
                         "causal.positional=\"rope\"")
    trained = run.config.causal.max_len
    length = args.length or 4 * trained
    window = args.window or trained // 2
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = held_out_rows(run, length)[: args.texts]
    result = S.compare(run.model, rows.long(), window=window, sinks=args.sinks, band=args.band or trained // 2)
    result["model"] = str(args.run)
    print(S.format_table(result))
    if args.out:
        with Publish(args.out, "sinks", overwrite=args.overwrite, sources=(args.run,)) as folder:
            atomic_write_json(folder / "sinks.json", result)
            S.plot(result, folder / "sinks.png")
        print(f"wrote {Path(args.out) / 'sinks.json'} and sinks.png")
    return 0


def cmd_induction(args) -> int:
    """``multihead induction``: the phase change of Olsson et al. in a 2-layer attention-only model."""
    import torch

    from ._io import Publish, atomic_write_json, check_target
    from .interpret import induction as I

    check_target(args.out, "induction", overwrite=args.overwrite)
    config = I.ToyConfig(steps=args.steps, seed=args.seed, num_heads=args.heads, half=args.half, vocab=args.vocab)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = I.train_toy(config, progress=not args.no_progress)
    r.pop("model")
    best = max(((l, h, v) for l, row in enumerate(r["prefix_matching"]) for h, v in enumerate(row)), key=lambda t: t[2])
    with Publish(args.out, "induction", overwrite=args.overwrite) as folder:
        atomic_write_json(folder / "induction.json", r)
        I.plot_toy(r, folder / "induction.png")
    print(I.format_scores({**r, "half": config.half}))
    print(f"phase change (repeated-half loss < half the first half's) at step {r['phase_change_step']}; best head "
          f"L{best[0]}H{best[1]} prefix matching {best[2]:.2f}")
    print(f"wrote {Path(args.out) / 'induction.json'} and induction.png")
    return 0


# ------------------------------------------------------------------------------------------------ heads, measured
def cmd_sweep(args) -> int:
    from .heads import sweep as S

    flags = argparse.Namespace(**vars(args))
    flags.heads = flags.init = flags.layer_decay = None  # the sweep sets the heads; it trains from scratch
    config = train_config_from_args(flags)
    config.run.progress = False
    summary = S.sweep(config, Path(args.out), heads=args.heads if args.kv_heads is None else None,
                      kv_heads=args.kv_heads, seeds=args.seeds, min_time=args.min_time, overwrite=args.overwrite)
    print(S.format_table(summary))
    print(f"wrote {Path(args.out) / 'sweep.json'} and sweep.png")
    return 0


def cmd_importance(args) -> int:
    from .heads import scores as imp
    from .train import tasks

    tasks.require(args.run, "importance")

    result = imp.score_run(args.run, args.method, data=args.data, split=args.split, n=args.n,
                           out=Path(args.out) if args.out else None)
    print(imp.format_table(result["tensor"], result["title"]))
    print(f"wrote {result['json']} and {result['files'][0]}")
    return 0


def cmd_prune(args) -> int:
    import torch

    from .heads import prune as P
    from .train import tasks

    tasks.require(args.run, "prune")
    if args.threads:
        torch.set_num_threads(args.threads)
    r = P.prune_run(args.run, Path(args.out), overwrite=args.overwrite, data=args.data, method=args.method, step=args.step,
                    max_drop=args.max_drop, until=args.until, speed_at=args.speed_at, min_time=args.min_time)
    speed = r["inference"]
    print(f"chosen: {r['pruned']}/{r['heads']} heads pruned ({r['fraction']:.0%}); test accuracy "
          f"{r['test_accuracy_pruned']:.4f} vs {r['base_test_accuracy']:.4f} unpruned; "
          f"|pruned - masked| = {r['max_abs_diff_pruned_vs_masked']:.1e}")
    for name, sec in speed["seconds"].items():
        print(f"  inference {name:<14} {sec:7.3f}s per test pass ({speed['speedup_vs_unpruned'][name]:.2f}x), "
              f"batch 32, {speed['threads']} threads")
    print(f"pruned run: {args.out} (pruning.json, pruning.png)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .bench import SUITES
    from .heads.scores import METHODS
    from .interpret.induction import ToyConfig as ToyDefaults
    p = argparse.ArgumentParser(prog="multihead", description="Multi-head attention: train, inspect, prune, run fast.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the tutorial's walk-through, run for real")
    d.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--limit", type=_count, default=None, help="examples per split (a quick smoke run)")
    d.add_argument("--epochs", type=_count, default=None, help="override the training epochs")
    d.add_argument("--walkthrough-only", action="store_true", help="skip training; only the attention walk-through")
    d.set_defaults(fn=cmd_demo)

    b = sub.add_parser("backends", help="list the registered attention backends and their capabilities")
    b.set_defaults(fn=cmd_backends)

    bench = sub.add_parser("bench", help="benchmarks: ours and peers in one run, JSON + PNG")
    bench.add_argument("suite", choices=list(SUITES), help="which benchmark")
    bench.add_argument("--lengths", type=_ints, default=None, help="comma-separated sequence lengths")
    bench.add_argument("--modes", type=_words, default=None, help="forward,train")
    bench.add_argument("--impls", type=_words, default=None, help="comma-separated implementations")
    bench.add_argument("--threads", type=_count, default=None, help="torch threads (default: what torch picks)")
    bench.add_argument("--device", default="cpu", help="cpu | cuda (attention, long, decode, kernels)")
    bench.add_argument("--dtype", default="fp32", help="fp32 | bf16 | fp16 (attention, long, decode, kernels)")
    bench.add_argument("--min-time", type=_seconds, default=1.0, help="seconds of timed repeats per case")
    bench.add_argument("--out", default=None, help="JSON path (default bench/results/<suite>-<time>.json)")
    bench.add_argument("--runs", default="runs/lra", help="lra: folder for the training runs")
    bench.add_argument("--max-len", type=_count, default=1024, help="lra: tokens per review")
    bench.add_argument("--epochs", type=_count, default=3, help="lra: epochs per variant")
    bench.add_argument("--limit", type=_count, default=None, help="lra: examples per split")
    bench.add_argument("--batches", type=_ints, default=None, help="decode: comma-separated batch sizes")
    bench.add_argument("--model", default=None, help="decode: race the shape of this causal LM run (pretrain clm)")
    bench.set_defaults(fn=cmd_bench)

    t = sub.add_parser("train", help="train a Transformer text classifier (or, with --data cmudict, a "
                                     "grapheme-to-phoneme encoder-decoder; with --data fashion_mnist or digits, a "
                                     "Vision Transformer); writes a run folder")
    t.add_argument("--data", default=None, help="built-in dataset (rotten_tomatoes, imdb, bbc_news, bbc_headlines), "
                                                "a .csv/.tsv/.jsonl file (default rotten_tomatoes), cmudict "
                                                "(grapheme-to-phoneme), or fashion_mnist / digits (images, ViT)")
    t.add_argument("--out", required=True, help="run folder")
    t.add_argument("--config", default=None,
                   help="TOML file with [data], [model], [model.encoder], [optim], [run], [pretrained]")
    for flag, (_, typ, help_) in TRAIN_FLAGS.items():
        t.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None, help=help_)
    t.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="any other config field")
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    t.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    t.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.set_defaults(fn=cmd_train)

    pt = sub.add_parser("pretrain", help="self-supervised pretraining on unlabelled text (masked LM); writes a "
                                         "run folder whose encoder `train --init` fine-tunes")
    pt.add_argument("--data", default=None, help="built-in dataset whose texts are used (default imdb; labels are "
                                                 "never read), a .txt file (one text per line) or .csv/.tsv/.jsonl")
    pt.add_argument("--out", required=True, help="run folder")
    pt.add_argument("--config", default=None, help="TOML file with [data], [objective], [model], [optim], [run]")
    for flag, (_, typ, help_) in PRETRAIN_FLAGS.items():
        pt.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None, help=help_)
    pt.add_argument("--whole-word", action="store_true", help="mask whole words (all pieces of a selected word)")
    pt.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="any other config field")
    pt.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    pt.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    pt.add_argument("--no-progress", action="store_true", help="no progress bars")
    pt.set_defaults(fn=cmd_pretrain)

    ge = sub.add_parser("generate", help="continue a prompt with a causal LM run (multihead pretrain --objective "
                                         "clm), streaming tokens; KV-cached decoding")
    ge.add_argument("run", help="pretraining run folder (objective clm)")
    ge.add_argument("prompt", nargs="?", default="", help="text to continue (default: start a new text)")
    ge.add_argument("--max-new", type=_count, default=50, help="new tokens at most (stops early at the end of a text)")
    ge.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    ge.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ge.add_argument("--top-k", type=_nonneg, default=0, help="sample from the k most likely tokens (0: all)")
    ge.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the smallest set reaching p")
    ge.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    ge.add_argument("--threads", type=_count, default=None, help="torch threads")
    ge.add_argument("--no-stream", dest="stream", action="store_false", help="print the text once, at the end")
    ge.set_defaults(fn=cmd_generate)

    e = sub.add_parser("evaluate", help="evaluate a run on a dataset split")
    e.add_argument("run")
    e.add_argument("--data", default=None, help="dataset (default: the run's own)")
    e.add_argument("--split", default="test", help="train | validation | test (the run's recorded split) | all")
    e.add_argument("--text-column", default=None)
    e.add_argument("--label-column", default=None)
    e.add_argument("--json", action="store_true")
    e.add_argument("--beam", type=_count, default=1, help="G2P runs: beam width (1 = greedy)")
    e.set_defaults(fn=cmd_evaluate)

    pr = sub.add_parser("predict", help="classify texts; prints JSON lines with label and probabilities")
    pr.add_argument("run")
    pr.add_argument("texts", nargs="*")
    pr.add_argument("--file", default=None, help="one text per line, or .jsonl with a 'text' field")
    pr.add_argument("--beam", type=_count, default=1, help="G2P runs: beam width (1 = greedy)")
    pr.add_argument("--index", type=_nonneg, default=None, help="image runs: predict this test image")
    pr.add_argument("--image", action="append", default=None, help="image runs: a .png or .npy image (repeatable)")
    pr.set_defaults(fn=cmd_predict)

    em = sub.add_parser("embed", help="sentence embeddings from a pretrained encoder (or a run's encoder)")
    em.add_argument("model", help="minilm, a BERT-family folder, or a run folder")
    em.add_argument("texts", nargs="*")
    em.add_argument("--file", default=None, help="one text per line, or .jsonl with a 'text' field")
    em.add_argument("--out", default=None, help="write JSON lines {text, embedding} here")
    em.add_argument("--batch-size", type=_count, default=32)
    em.set_defaults(fn=cmd_embed)

    ex = sub.add_parser("export", help="write an encoder (pretrained or a run's) as an HF BertModel folder")
    ex.add_argument("source", help="minilm, a BERT-family folder, or a run folder")
    ex.add_argument("--out", required=True, help="folder to write")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing folder at --out")
    ex.set_defaults(fn=cmd_export)

    sh = sub.add_parser("show", help="pictures (PNG+SVG) and an offline web page of every head for one text")
    sh.add_argument("model", help="a run folder (classifier, G2P or ViT), minilm, or a BERT-family folder")
    sh.add_argument("text", nargs="?", default="", help="the text (a word for G2P runs; none for image runs)")
    sh.add_argument("--index", type=_nonneg, default=None, help="image runs: this test image")
    sh.add_argument("--image", default=None, help="image runs: a .png or .npy image")
    sh.add_argument("--question", default=None, help="grounding runs: a question about the canvas, e.g. "
                                                     "\"where is the bag?\" (default: the canvas's own)")
    sh.add_argument("--patch", default=None, help="image runs: ROW,COL of the patch whose attention is drawn "
                                                  "(default the centre)")
    sh.add_argument("--out", default=None, help="folder to write (G2P runs: default RUN/show/WORD)")
    sh.add_argument("--heads", type=_head_list, default=None, help="heads to draw at full size, e.g. 1:8,5:3")
    sh.add_argument("--no-rollout", action="store_true", help="skip the attention-rollout picture")
    sh.add_argument("--max-len", type=_count, default=None, help="tokens read (rotary models read any length; over "
                                                              "1,024 the page is built from statistics, no map)")
    sh.add_argument("--overwrite", action="store_true", help="replace a folder of other files at --out")
    sh.set_defaults(fn=cmd_show)

    sk = sub.add_parser("sinks", help="attention sinks: perplexity on long held-out text with a full, a sliding-"
                                      "window and a window + sinks cache (StreamingLLM), for a rotary causal LM run")
    sk.add_argument("run", help="pretraining run folder (objective clm, positional rope)")
    sk.add_argument("--length", type=_count, default=None, help="tokens per text (default 4x the trained row length)")
    sk.add_argument("--window", type=_count, default=None, help="window of recent tokens (default half a trained row)")
    sk.add_argument("--sinks", type=_nonneg, default=4, help="first tokens kept by the sinks cache (paper: 4)")
    sk.add_argument("--band", type=_count, default=None, help="positions per perplexity band (default half a row)")
    sk.add_argument("--texts", type=_count, default=8, help="held-out streams averaged")
    sk.add_argument("--threads", type=_count, default=None)
    sk.add_argument("--out", default=None, help="write sinks.json and sinks.png here")
    sk.add_argument("--overwrite", action="store_true")
    sk.set_defaults(fn=cmd_sinks)

    ind = sub.add_parser("induction", help="induction heads form: a 2-layer attention-only model trained on "
                                           "repeated random tokens (loss curves, prefix-matching scores, PNG)")
    ind.add_argument("--out", required=True, help="folder for induction.json and induction.png")
    ind.add_argument("--steps", type=_count, default=ToyDefaults.steps, help="training steps")
    ind.add_argument("--heads", type=_count, default=ToyDefaults.num_heads, help="heads per layer")
    ind.add_argument("--half", type=_count, default=ToyDefaults.half, help="random tokens before the repeat")
    ind.add_argument("--vocab", type=_count, default=ToyDefaults.vocab,
                     help="token ids the random tokens are drawn from (small: repeats inside a half blur the score)")
    ind.add_argument("--seed", type=int, default=0)
    ind.add_argument("--threads", type=_count, default=None)
    ind.add_argument("--overwrite", action="store_true")
    ind.add_argument("--no-progress", action="store_true")
    ind.set_defaults(fn=cmd_induction)

    cp = sub.add_parser("compare", help="attention variants (MHA, GQA, MLA, gated, sinks, differential, ALiBi, "
                                        "talking heads) trained and measured side by side on one causal LM")
    cp.add_argument("--data", default="imdb", help="texts to pretrain on (built-in or a file)")
    cp.add_argument("--variants", default="mha,gqa,mla,gated,sinks,diff,alibi", help="comma-separated variants")
    cp.add_argument("--seeds", type=_count, default=3, help="seeds per variant (0..N-1)")
    cp.add_argument("--steps", type=_count, default=600, help="optimizer steps per run")
    cp.add_argument("--batch-size", type=_count, default=32)
    cp.add_argument("--seq-len", type=_count, default=128, help="tokens per row (the trained length)")
    cp.add_argument("--lr", type=float, default=2e-3)
    cp.add_argument("--d-model", type=_count, default=None)
    cp.add_argument("--heads", type=_count, default=None)
    cp.add_argument("--layers", type=_count, default=None)
    cp.add_argument("--d-ff", type=_count, default=None, help="the baseline's FFN width (others matched to its "
                                                               "parameter count)")
    cp.add_argument("--no-match-params", action="store_true",
                    help="one FFN width for every variant instead of matching the baseline's parameter count")
    cp.add_argument("--vocab-size", type=_count, default=None)
    cp.add_argument("--limit", type=_count, default=None, help="use N texts (smoke tests)")
    cp.add_argument("--threads", type=_count, default=None)
    cp.add_argument("--out", required=True, help="folder for one run per variant x seed and compare.json/.png")
    cp.add_argument("--overwrite", action="store_true")
    cp.set_defaults(fn=cmd_compare)

    hd = sub.add_parser("heads", help="per-head statistics and role labels over a corpus sample")
    hd.add_argument("model", help="a run folder, minilm, or a BERT-family folder")
    hd.add_argument("--data", default="rotten_tomatoes", help="built-in dataset or a .csv/.tsv/.jsonl file")
    hd.add_argument("--n", type=_count, default=200, help="texts to use (default 200)")
    hd.add_argument("--split", default="test", choices=["test", "all"], help="the fixed test split, or all rows")
    hd.add_argument("--text-column", default="text")
    hd.add_argument("--label-column", default="label")
    hd.add_argument("--max-len", type=_count, default=None, help="tokens per input (rotary models read any length)")
    hd.add_argument("--concat", action="store_true", help="join consecutive texts into inputs of --max-len tokens")
    hd.add_argument("--from", dest="source", choices=["maps", "stats"], default=None,
                    help="compute from full maps or from exact statistics in linear memory (default: stats above "
                         "1,024 tokens)")
    hd.add_argument("--out", default=None, help="write heads.json and heads.png/.svg here")
    hd.add_argument("--json", action="store_true")
    hd.add_argument("--overwrite", action="store_true", help="replace a folder of other files at --out")
    hd.set_defaults(fn=cmd_heads)

    im = sub.add_parser("importance", help="per-head importance of a trained run (layers x heads table + heatmap)")
    im.add_argument("run")
    im.add_argument("--data", default=None, help="dataset (default: the run's own)")
    im.add_argument("--split", default="validation", help="train | validation | test | all")
    im.add_argument("--method", default="michel", choices=list(METHODS))
    im.add_argument("--n", type=_count, default=None, help="use the first N texts")
    im.add_argument("--out", default=None, help="folder for JSON + PNG (default RUN/importance)")
    im.set_defaults(fn=cmd_importance)

    sw = sub.add_parser("sweep", help="train one model per head count (fixed d_model) and seed; table, JSON, PNG")
    sw.add_argument("--data", default=None, help="dataset (default rotten_tomatoes)")
    sw.add_argument("--out", required=True, help="folder for the runs and sweep.json")
    sw.add_argument("--heads", type=_ints, default=[1, 2, 4, 8, 16], help="head counts (default 1,2,4,8,16)")
    sw.add_argument("--kv-heads", type=_ints, default=None,
                    help="sweep key/value heads instead, at --set model.encoder.num_heads=H (MHA/GQA/MQA)")
    sw.add_argument("--seeds", type=_count, default=3)
    sw.add_argument("--min-time", type=_seconds, default=2.0, help="seconds of inference timing per model")
    sw.add_argument("--config", default=None, help="TOML train config (as for train)")
    for flag, (_, typ, help_) in TRAIN_FLAGS.items():
        if flag not in ("heads", "init", "layer_decay", "seed"):
            sw.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None, help=help_)
    sw.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="any other config field")
    sw.add_argument("--overwrite", action="store_true", help="write into a folder of other files at --out")
    sw.set_defaults(fn=cmd_sweep, compile=False, no_progress=True, seed=None)

    pu = sub.add_parser("prune", help="iterative head pruning on validation, then a physically pruned run folder")
    pu.add_argument("run")
    pu.add_argument("--data", default=None, help="dataset (default: the run's own)")
    pu.add_argument("--out", required=True, help="folder for the pruned run")
    pu.add_argument("--method", default="michel", choices=list(METHODS))
    pu.add_argument("--step", type=_fraction, default=0.1, help="fraction of remaining heads masked per round")
    pu.add_argument("--max-drop", type=_fraction, default=0.01, help="largest validation accuracy loss accepted")
    pu.add_argument("--until", type=_fraction, default=0.0, help="continue the curve until this fraction is pruned")
    pu.add_argument("--speed-at", type=_fraction, default=None,
                    help="also time a model pruned to this fraction (e.g. 0.5), from the curve")
    pu.add_argument("--min-time", type=_seconds, default=3.0, help="seconds of timing per model")
    pu.add_argument("--threads", type=_count, default=None)
    pu.add_argument("--overwrite", action="store_true", help="replace an existing run at --out")
    pu.set_defaults(fn=cmd_prune)

    dd = sub.add_parser("data", help="print a dataset card: sizes, classes, length percentiles")
    dd.add_argument("name", help="built-in name or a .csv/.tsv/.jsonl file")
    dd.add_argument("--text-column", default="text")
    dd.add_argument("--label-column", default="label")
    dd.add_argument("--seed", type=int, default=0, help="split seed")
    dd.add_argument("--json", action="store_true")
    dd.set_defaults(fn=cmd_data)
    return p


BUG_REPORT = "the project's issue tracker"


def _check_argv(argv: list[str]) -> None:
    """Arguments arrive as text; bytes that are not UTF-8 (decoded by Python as surrogates) would fail deep inside a
    tokenizer or a file name, so they are refused here with their position."""
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise ValueError(f"argument {i} ({shown!r}) is not valid UTF-8 text; pass UTF-8 (e.g. convert it with "
                             "iconv -t UTF-8)") from None


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad input ends with ``error: ...`` on stderr and exit status 2, never a traceback; a bug
    ends with ``internal error`` and exit 70 (``MULTIHEAD_DEBUG=1`` shows the traceback)."""
    import os

    from ._io import FolderError
    from .data import DataError
    from .pretrained import PretrainedError
    from .train import CheckpointError, RunExistsError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        _check_argv(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (DataError, CheckpointError, RunExistsError, PretrainedError, FolderError, FileNotFoundError,
            ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # permissions, a full disk, a folder where a file was expected
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; files written so far are complete (every write is atomic)", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: say so, without a traceback unless asked
        if os.environ.get("MULTIHEAD_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}\n"
              f"This is a bug in multihead, not in your input. Please report it at {BUG_REPORT} with the command you "
              "ran (MULTIHEAD_DEBUG=1 shows the traceback).", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
