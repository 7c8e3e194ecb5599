"""``multihead evaluate``, ``predict``, ``data``, ``embed`` and ``export``: using a finished run (or a pretrained
model). What a run folder is comes from the task registry (:mod:`multihead.train.tasks`).
"""

from __future__ import annotations

from pathlib import Path

from .args import _count, _fraction, _nonneg, _number, _read_texts, Route


def cmd_evaluate(args) -> int | Route:
    return Route("evaluate", args.run)


def evaluate_text(args) -> int:
    import json

    from ..train import evaluate, load_run

    run = load_run(args.run)
    r = evaluate(run, args.data, split=args.split, text_column=args.text_column, label_column=args.label_column)
    if args.json:
        print(
            json.dumps(
                {
                    k: r[k]
                    for k in (
                        "dataset",
                        "split",
                        "accuracy",
                        "macro_f1",
                        "loss",
                        "n",
                        "confusion",
                        "labels",
                        "truncated",
                    )
                }
            )
        )
    else:
        print(
            f"{r['dataset']} [{r['split']}]: accuracy {r['accuracy']:.4f}, macro-F1 {r['macro_f1']:.4f}, "
            f"loss {r['loss']:.4f}, n={r['n']}"
        )
        print("confusion (rows true, columns predicted): " + ", ".join(r["labels"]))
        for name, row in zip(r["labels"], r["confusion"]):
            print(f"  {name:<16} " + " ".join(f"{v:>6}" for v in row))
    return 0


def evaluate_g2p(args) -> int:
    import json

    from ..train.g2p import evaluate_run, load_g2p_run

    r = evaluate_run(load_g2p_run(args.run), args.split, beam=args.beam)
    if args.json:
        print(json.dumps(r))
    else:
        how = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        print(
            f"cmudict [{r['split']}], {how}: word error rate {r['wer']:.4f}, phoneme error rate "
            f"{r['per']:.4f} (n={r['words']} words); without stress (39 phones, as published CMUdict tables "
            f"score): WER {r['wer_no_stress']:.4f}, PER {r['per_no_stress']:.4f}"
        )
    return 0


def evaluate_grounding(args) -> int:
    """``multihead evaluate runs/qa``: accuracy on the held-out test canvases, per question kind."""
    import json

    from ..train.grounding import evaluate_run, load_grounding_run

    if args.split != "test":
        raise ValueError(f"a grounding run is scored on its held-out test canvases; drop --split {args.split}")
    r = evaluate_run(load_grounding_run(args.run))
    if args.json:
        print(json.dumps(r))
    else:
        kinds = ", ".join(f"{k} {v:.4f}" for k, v in r["by_kind"].items())
        print(
            f"{r['dataset']} [test canvases]: accuracy {r['accuracy']:.4f} ({kinds}), loss {r['loss']:.4f}, n={r['n']}"
        )
    return 0


def evaluate_lm(args) -> int:
    """``multihead evaluate runs/lm``: loss and perplexity on the run's held-out texts."""
    import json

    from ..train.pretrain import evaluate_run, load_pretrain_run

    r = evaluate_run(load_pretrain_run(args.run))
    if args.json:
        print(json.dumps(r))
    else:
        what = "masked" if r["objective"] == "mlm" else "next-token"
        print(
            f"{r['data']} [held-out texts, {r['objective']}]: loss {r['loss']:.4f}, perplexity "
            f"{r['perplexity']:.1f}, {what} accuracy {r['accuracy']:.4f} (n={r['tokens']} tokens)"
        )
    return 0


def evaluate_vision(args) -> int:
    import json

    from ..data.images import load_images
    from ..train.vision import evaluate_images, load_vision_run

    run = load_vision_run(args.run)
    dc = run.config.data
    splits = load_images(dc.name, path=dc.path, seed=dc.split_seed)
    if args.split not in ("train", "validation", "test"):
        raise ValueError(f"--split must be train, validation or test for an image run, got {args.split!r}")
    r = evaluate_images(run.model, *getattr(splits, args.split))
    if args.json:
        print(
            json.dumps(
                {
                    "dataset": dc.name,
                    "split": args.split,
                    **{k: r[k] for k in ("accuracy", "macro_f1", "loss", "n", "confusion")},
                    "labels": run.labels,
                }
            )
        )
    else:
        print(
            f"{dc.name} [{args.split}]: accuracy {r['accuracy']:.4f}, macro-F1 {r['macro_f1']:.4f}, "
            f"loss {r['loss']:.4f}, n={r['n']}"
        )
    return 0


def cmd_predict(args) -> int | Route:
    return Route("predict", args.run)


def predict_text(args) -> int:
    import json

    from ..train import load_run, predict

    texts = _read_texts(args.texts, args.file)
    if not texts:
        raise ValueError("nothing to predict: pass texts as arguments or --file FILE (one text per line, or .jsonl)")
    for row in predict(load_run(args.run), texts):
        print(json.dumps(row, ensure_ascii=False))
    return 0


def predict_g2p(args) -> int:
    from ..train.g2p import load_g2p_run, predict_words

    words = _read_texts(args.texts, args.file)
    if not words:
        raise ValueError("nothing to predict: pass words as arguments or --file FILE (one word per line)")
    for row in predict_words(load_g2p_run(args.run), words, beam=args.beam):
        print(f"{row['word']}\t{row['phonemes']}")
    return 0


def predict_vision(args) -> int:
    """``multihead predict RUN --index 17`` (a test image) or ``--image x.png|x.npy``: class probabilities."""
    import json

    from ..train.vision import held_out_images, load_vision_run, predict_images, read_image

    run = load_vision_run(args.run)
    items = []
    if args.index is not None:
        images, labels = held_out_images(run)
        if not 0 <= args.index < len(labels):
            raise ValueError(f"--index {args.index} is outside the test split (0..{len(labels) - 1})")
        items.append((f"test[{args.index}]", images[args.index : args.index + 1], run.labels[int(labels[args.index])]))
    for path in args.image or []:
        items.append((path, read_image(path, run.model.config), None))
    if not items:
        raise ValueError("nothing to predict: pass --index N (a test image) or --image FILE.png|.npy")
    for name, image, truth in items:
        probs = predict_images(run.model, image)[0]
        top = probs.argsort(descending=True)[:3].tolist()
        row = {
            "image": name,
            "label": run.labels[top[0]],
            "probability": round(float(probs[top[0]]), 4),
            "top3": {run.labels[i]: round(float(probs[i]), 4) for i in top},
        }
        if truth is not None:
            row["true"] = truth
        print(json.dumps(row))
    return 0


def cmd_data(args) -> int:
    import json

    from .. import data as D

    ds = D.load(args.name, text_column=args.text_column, label_column=args.label_column)
    info = D.card(ds, D.split(ds, seed=args.seed))
    print(json.dumps(info, indent=2) if args.json else D.format_card(info))
    return 0


def cmd_embed(args) -> int | Route:
    return Route("embed", args.model)


def embed(args) -> int:
    """Sentence embeddings of texts from an encoder (pretrained or a run's)."""
    import json

    from ..loading import load
    from ..pretrained import embed_texts

    texts = _read_texts(args.texts, args.file)
    if not texts:
        raise ValueError("nothing to embed: pass texts as arguments or --file FILE (one text per line, or .jsonl)")
    s = load(args.model, text=True)
    vectors = embed_texts(
        s.model,
        s.tokenizer,
        texts,
        s.sentence_max_len,
        batch_size=args.batch_size,
        progress=len(texts) > 4 * args.batch_size,
    )
    if args.out:
        from ..train.runfolder import atomic_write_bytes

        lines = "".join(
            json.dumps({"text": t, "embedding": [round(x, 7) for x in v]}, ensure_ascii=False) + "\n"
            for t, v in zip(texts, vectors.tolist())
        )
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


def cmd_export(args) -> int | Route:
    return Route("export", args.source)


def export_encoder(args) -> int:
    """``export`` of a text encoder (pretrained or a run's) as an HF BertModel folder."""
    if args.prune:
        raise ValueError("--prune removes heads of a causal LM read from an HF folder; this source is not one")
    from .. import pretrained
    from ..loading import load

    from .._io import check_target

    check_target(args.out, "hf", overwrite=args.overwrite, sources=(args.source,))  # before loading anything
    s = load(args.source, text=True)
    out = pretrained.export(s.model, s.tokenizer, args.out, overwrite=args.overwrite, sources=(args.source,))
    print(
        f"wrote an HF BertModel folder to {out} (config.json, model.safetensors, tokenizer.json, vocab.txt); "
        "load it with transformers.BertModel.from_pretrained"
    )
    return 0


def _beam(parser) -> None:
    parser.add_argument(
        "--beam",
        type=_number(int, 1, 64, "a beam width in [1, 64]"),
        default=1,
        help="G2P runs: beam width (1 = greedy)",
    )


def _parser_export(sub) -> None:
    ex = sub.add_parser(
        "export",
        help="write a model as an HF folder: an encoder (pretrained or a run's) as BertModel, a pretrained LM as "
        "Llama/Qwen/GPT-2 with its tokenizer, special tokens and chat template",
    )
    ex.add_argument(
        "source",
        help="minilm, a BERT-family folder, or a run folder; or a pretrained LM (smollm2, .gguf, "
        "HF folder), written as an HF Llama/Qwen/GPT-2 folder",
    )
    ex.add_argument("--out", required=True, help="folder to write")
    ex.add_argument(
        "--prune",
        default=None,
        metavar="IMPORTANCE",
        help="HF folders read by transformers: remove the heads `multihead prune` chose (its --out folder or "
        "importance-michel.json) before writing; with --fraction",
    )
    ex.add_argument("--fraction", type=_fraction, default=None, help="with --prune: which of its fractions")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing folder at --out")
    ex.set_defaults(fn=cmd_export)


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    e = sub.add_parser("evaluate", help="evaluate a run on a dataset split")
    e.add_argument("run")
    e.add_argument("--data", default=None, help="dataset (default: the run's own)")
    e.add_argument("--split", default="test", help="train | validation | test (the run's recorded split) | all")
    e.add_argument("--text-column", default=None)
    e.add_argument("--label-column", default=None)
    e.add_argument("--json", action="store_true")
    _beam(e)
    e.set_defaults(fn=cmd_evaluate)

    pr = sub.add_parser(
        "predict",
        help="use a run: classify texts (JSON lines with label and probabilities), pronounce words (G2P runs) or "
        "classify test images (ViT runs)",
    )
    pr.add_argument("run")
    pr.add_argument("texts", nargs="*")
    pr.add_argument("--file", default=None, help="one text per line, or .jsonl with a 'text' field")
    _beam(pr)
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

    _parser_export(sub)

    dd = sub.add_parser("data", help="print a dataset card: sizes, classes, length percentiles")
    dd.add_argument("name", help="built-in name or a .csv/.tsv/.jsonl file")
    dd.add_argument("--text-column", default="text")
    dd.add_argument("--label-column", default="label")
    dd.add_argument("--seed", type=int, default=0, help="split seed")
    dd.add_argument("--json", action="store_true")
    dd.set_defaults(fn=cmd_data)
