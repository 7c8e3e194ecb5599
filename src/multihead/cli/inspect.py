"""``multihead show``, ``heads``, ``importance`` and ``prune``: looking inside a model (pictures, the page, head
roles, head importance and pruning). The task registry says which run kinds each takes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .args import (
    LazyChoices,
    _count,
    _threads,
    _fraction,
    _head_list,
    _needles,
    _nonneg,
    _port,
    _seconds,
    Route,
    say_attached,
    since_start,
)


def cmd_show(args) -> int | Route:
    return Route("show", args.model)


def show_text(args) -> int:
    """``show`` on a text model (a classifier run, an encoder, a causal LM): the pictures and the page."""
    from .._io import check_target
    from ..interpret import load_subject
    from ..interpret.pages.show import show

    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write the pictures and the page")
    check_target(args.out, "show", overwrite=args.overwrite, sources=(args.model,))
    if not args.text.strip():
        raise ValueError('the text to show is empty; pass a sentence, e.g. "The cat sat on the mat."')
    from ..interpret.maps import lift_max_len

    read = since_start()
    subject = load_subject(args.model)
    read = since_start() - read
    say_attached(getattr(subject, "lm", None))
    if args.max_len:
        lift_max_len(subject, args.max_len)
    summary = show(
        subject, args.text, Path(args.out), heads=args.heads, rollout=not args.no_rollout, overwrite=args.overwrite
    )
    print(
        f"{len(summary['tokens'])} tokens: {' '.join(summary['tokens'][:40])}"
        f"{' ...' if len(summary['tokens']) > 40 else ''}"
    )
    print(
        f"wrote {len(summary['files'])} files to {args.out}, {since_start():.1f}s after the command started "
        f"(reading the model {read:.1f}s, the text and its pictures {summary['seconds']['total']:.1f}s); open "
        f"{Path(args.out) / 'attention.html'} in a browser (works offline)"
    )
    return 0


def _parse_patch(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        patch = tuple(int(v) for v in text.split(","))
        assert len(patch) == 2
    except (ValueError, AssertionError):
        raise ValueError(f"--patch takes ROW,COL (e.g. 3,3), got {text!r}") from None
    return patch


def show_vision(args) -> int:
    """``multihead show runs/vit --index 17`` / ``--image x.png``: attention over the image, rollout, one patch's
    view, and the mean attention distance per head over 1,000 test images."""
    from .._io import Publish, atomic_write_json, check_target
    from ..interpret.media.vision import attention_distance, plot_distance, show_image
    from ..train.vision import held_out_images, load_vision_run, read_image

    if (args.index is None) == (args.image is None):
        raise ValueError("pass one image: --index N (a test image) or --image FILE.png|.npy")
    patch = _parse_patch(args.patch)
    name = f"test-{args.index}" if args.index is not None else Path(args.image).stem
    out = Path(args.out) if args.out else Path(args.model) / "show" / name
    check_target(out, "show", overwrite=args.overwrite, sources=(args.model,))
    run = load_vision_run(args.model)
    images, labels = held_out_images(run)
    truth = None
    if args.index is not None:
        if not 0 <= args.index < len(labels):
            raise ValueError(f"--index {args.index} is outside the test split (0..{len(labels) - 1})")
        image, truth = images[args.index : args.index + 1], run.labels[int(labels[args.index])]
    else:
        image = read_image(args.image, run.model.config)
    with Publish(out, "show", overwrite=args.overwrite, sources=(args.model,), check=False) as folder:
        summary = show_image(run.model, image, run.labels, folder, truth=truth, patch=patch, name=name)
        sample = images[:1000]
        dist = attention_distance(run.model, sample)
        summary["files"] += [
            str(f.relative_to(folder))
            for f in plot_distance(
                dist, run.model, folder / "distance", f"mean attention distance, {len(sample)} test images"
            )
        ]
        summary["mean_attention_distance"] = [d.tolist() for d in dist]
        atomic_write_json(folder / "image.json", summary)
    print(f"{name}: predicted {summary['predicted']}" + (f" (true {truth})" if truth else ""))
    print(
        "mean attention distance (pixels) per layer: "
        + "; ".join(" ".join(f"{v:.1f}" for v in d) for d in summary["mean_attention_distance"])
    )
    print(f"wrote {len(summary['files'])} files to {out}")
    return 0


def show_dinov2(args) -> int:
    """``multihead show dinov2 --image photo.jpg``: DINOv2-small's attention on any photograph (its evaluation
    crop): [CLS] attention per head, one patch's view, rollout and the page."""
    from .. import dinov2
    from .._io import Publish, check_target
    from ..interpret.media.vision import show_image

    if args.image is None:
        raise ValueError("pass --image PHOTO (.jpg or .png): the picture DINOv2 looks at")
    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write the pictures and the page")
    patch = _parse_patch(args.patch)
    check_target(args.out, "show", overwrite=args.overwrite, sources=(args.model, args.image))
    photo = dinov2.read_photo(args.image)
    from ..loading import load as load_source  # the one loader: it knows what a source is

    d = load_source(args.model).detail
    u8, x = dinov2.square(photo, size=args.size or 224, patch=d.model.config.patch_size)
    name = Path(args.image).stem
    with Publish(
        Path(args.out), "show", overwrite=args.overwrite, sources=(args.model, args.image), check=False
    ) as folder:
        summary = show_image(
            d.model,
            u8,
            None,
            folder,
            patch=patch,
            name=name,
            inputs=x,
            model_name="DINOv2-small",
            note=dinov2.ARTIFACTS,
        )
    g = u8.shape[-1] // d.model.config.patch_size
    print(f"{name}: DINOv2-small on its {u8.shape[-1]} x {u8.shape[-1]} centre crop ({g} x {g} patches)")
    print(f"wrote {len(summary['files'])} files to {args.out}; open {Path(args.out) / 'attention.html'} in a browser")
    return 0


def show_whisper(args) -> int:
    """``multihead show whisper --audio speech.wav --out DIR``: the transcript with word times, every cross-attention
    head over time, the cross-attention page (tokens and 20 ms frames) and the decoder's page."""
    from .. import whisper
    from .._io import Publish, check_target
    from ..interpret.media.speech import show_speech

    if args.audio is None:
        raise ValueError("pass --audio FILE.wav: the speech Whisper listens to")
    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write the pictures and the pages")
    check_target(args.out, "show", overwrite=args.overwrite, sources=(args.model, args.audio))
    audio = whisper.read_wav(args.audio)
    from ..loading import load as load_source  # the one loader: it knows what a source is

    w = load_source(args.model).detail
    name = Path(args.audio).stem
    with Publish(
        Path(args.out), "show", overwrite=args.overwrite, sources=(args.model, args.audio), check=False
    ) as folder:
        summary = show_speech(w, audio[: whisper.SAMPLE_RATE * whisper.CHUNK], folder, name=name)
    print(f"{name}: {summary['text']}")
    print("  " + " ".join(f"{x['word']}@{x['start']:.2f}s" for x in summary["words"]))
    print(f"wrote {len(summary['files'])} files to {args.out}; open {Path(args.out) / 'cross.html'} in a browser")
    return 0


def show_grounding(args) -> int:
    """``multihead show runs/qa --index 3 [--question "where is the bag?"]``: a test canvas, the model's answer, and each
    cross-attention head's attention of the question over the canvas."""
    from ..data.batching import as_batch

    from .._io import Publish, atomic_write_json, check_target
    from ..interpret.media.vision import show_grounding
    from ..train.grounding import load_grounding_run, test_canvases

    if args.index is None or args.image is not None:
        raise ValueError(
            'pass --index N (a held-out test canvas) and optionally --question "where is the bag?" '
            "(default: the canvas's own question)"
        )
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
    q = data.questions[i : i + 1] if question is None else as_batch(question)
    truth = run.answers[int(data.answers[i])] if question is None else None
    with Publish(out, "show", overwrite=args.overwrite, sources=(args.model,), check=False) as folder:
        summary = show_grounding(run.model, data.canvases[i : i + 1], q, vocab, folder, truth=truth, name=f"canvas-{i}")
        atomic_write_json(folder / "canvas.json", summary)
    print(
        f"canvas {i}: {summary['question']} -> {summary['answer']} ({summary['probability']:.2f})"
        + (f"; true {truth}" if truth else "")
    )
    print(f"wrote {len(summary['files'])} files to {out}")
    return 0


def show_g2p(args) -> int:
    from ..data.g2p import check_word
    from ..interpret.media.g2p import show_g2p
    from ..train.g2p import load_g2p_run

    from .._io import check_target

    word = check_word(args.text)  # before anything is loaded or written
    out = Path(args.out) if args.out else Path(args.model) / "show" / word.replace("'", "_")
    check_target(out, "show", overwrite=args.overwrite, sources=(args.model,))
    summary = show_g2p(load_g2p_run(args.model), word, out, overwrite=args.overwrite)
    print(f"wrote {len(summary['files'])} files to {out}; open {out / 'cross.html'} in a browser (works offline)")
    return 0


def _attached_folder(source: str, out, verb: str, overwrite: bool):
    """The HF folder ``source`` read attached (an :class:`~multihead.hf.models.AttachedFolder`), after ``out`` is
    checked."""
    from .._io import check_target
    from ..loading import load as load_source

    if out is None:
        raise ValueError("pass --out FOLDER: where to write the pictures and the page")
    check_target(out, verb, overwrite=overwrite, sources=(source,))
    return load_source(source).detail


def show_seq2seq(args) -> int:
    """``multihead show FOLDER "text"`` on an HF sequence-to-sequence folder: the text translated, then the
    encoder's, the decoder's and the cross-attention maps of that pass."""
    from ..interpret.media.seq2seq import show_seq2seq as show

    if not args.text.strip():
        raise ValueError('the text to show is empty; pass a sentence, e.g. "The cat sat on the mat."')
    folder = _attached_folder(args.model, args.out, "show", args.overwrite)
    summary = show(folder, args.text, Path(args.out), overwrite=args.overwrite)
    print(f"{len(summary['source_tokens'])} source tokens: {' '.join(summary['source_tokens'][:40])}")
    print(f"output ({len(summary['output_tokens'])} tokens): {summary['output']}")
    print(
        f"wrote {len(summary['files'])} files to {args.out}; open {Path(args.out) / 'cross.html'} (and encoder.html, "
        "decoder.html) in a browser (works offline)"
    )
    return 0


def show_attached_vision(args) -> int:
    """``multihead show FOLDER --image PHOTO`` on an HF vision folder: every head's [CLS] attention, one patch's
    view, rollout and the page, on the model's own crop of the photograph."""
    from .. import dinov2
    from .._io import Publish
    from ..interpret.media.vision import show_image

    if args.image is None:
        raise ValueError("pass --image PHOTO (.jpg or .png): the picture the model looks at")
    patch = _parse_patch(args.patch)
    folder = _attached_folder(args.model, args.out, "show", args.overwrite)
    photo = dinov2.read_photo(args.image)
    u8, x = folder.pixels(photo)
    model = folder.model
    name = Path(args.image).stem
    with Publish(
        Path(args.out), "show", overwrite=args.overwrite, sources=(args.model, args.image), check=False
    ) as out:
        summary = show_image(model, u8, model.labels, out, patch=patch, name=name, inputs=x, model_name=folder.family)
    g = u8.shape[-1] // model.config.patch_size
    said = f"; predicted {summary['predicted']}" if summary["predicted"] is not None else ""
    print(f"{name}: {folder.family} on its {u8.shape[-1]} x {u8.shape[-1]} centre crop ({g} x {g} patches){said}")
    print(f"wrote {len(summary['files'])} files to {args.out}; open {Path(args.out) / 'attention.html'} in a browser")
    return 0


def heads_seq2seq(args) -> int:
    """``multihead heads FOLDER`` on an HF sequence-to-sequence folder: roles of the encoder's and the decoder's
    heads and each cross-attention head's entropy and monotonicity, over texts of a data set."""
    import json

    from .. import data as D
    from ..interpret.media import seq2seq as S

    from .._io import check_target
    from ..loading import load as load_source

    if args.source == "stats":
        raise ValueError(
            "--from stats reads a decoder-only or an encoder model; a sequence-to-sequence folder's heads are read "
            "from maps (drop --from)"
        )
    if args.out:
        check_target(args.out, "heads", overwrite=args.overwrite, sources=(args.model,))
    folder = load_source(args.model).detail
    ds = D.load(args.data, text_column=args.text_column, label_column=args.label_column)
    pool = D.split(ds, seed=0).test.texts if args.split == "test" else ds.texts
    result = S.head_study(folder, pool[: args.n])
    result["data"] = {"name": args.data, "split": args.split, "n": min(args.n, len(pool))}
    print(json.dumps(result) if args.json else S.format_study(result))
    if args.out:
        files = S.write_study(result, Path(args.out), overwrite=args.overwrite, sources=(args.model,))
        print(f"wrote {', '.join(str(f) for f in files)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_heads(args) -> int | Route:
    if args.out:
        from .._io import check_target

        check_target(args.out, "heads", overwrite=args.overwrite, sources=(args.model,))
    return Route("heads --kv" if args.kv else "heads", args.model)


def heads_text(args) -> int:
    """Head roles of a text encoder, a classifier run or an attached LM on a data set, from maps or statistics."""
    import json
    import resource
    import time

    from .. import data as D
    from ..interpret import load_subject
    from ..interpret.roles import scores as roles
    from ..interpret.maps import concatenated, lift_max_len
    from ..interpret.roles.scores import subject_head_stats

    subject = load_subject(args.model)
    say_attached(getattr(subject, "lm", None))
    if args.max_len:
        lift_max_len(subject, args.max_len)
    ds = D.load(args.data, text_column=args.text_column, label_column=args.label_column)
    pool = D.split(ds, seed=0).test.texts if args.split == "test" else ds.texts
    texts = concatenated(subject, pool, args.n) if args.concat else pool[: args.n]
    source = args.source or ("stats" if subject.max_len > 1024 else "maps")
    t0 = time.perf_counter()
    if source == "maps":
        corpus = subject.maps(texts)
        result = roles.analyse(corpus)
    else:  # exact statistics on the model's own (fused) path: no L x L map is built
        stats, tokens = subject_head_stats(subject, texts, batch_size=1 if subject.max_len > 1024 else 32)
        result = roles.summarise(stats, subject.name, len(texts), tokens, "stats")
    result["data"] = {
        "name": args.data,
        "split": args.split,
        "n": len(texts),
        "concatenated": bool(args.concat),
        "max_len": subject.max_len,
    }
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


def heads_dinov2(args) -> int:
    """``multihead heads dinov2 --out DIR``: on scikit-image's photographs, the last layer's [CLS] attention on the
    object (a stated box), the mean attention distance per head against depth (beside a ViT run's with
    ``--compare``), and high-norm tokens."""

    from .._io import Publish, atomic_write_json
    from ..interpret.media import dino

    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write heads.json and the pictures")
    compare = None
    if args.compare:
        from ..interpret.media.vision import attention_distance_grid
        from ..train.vision import held_out_images, load_vision_run

        run = load_vision_run(args.compare)
        images, _ = held_out_images(run)
        compare = (attention_distance_grid(run.model, images[:1000]), run.model.config.image_size)
    from ..loading import load as load_source  # the one loader: it knows what a source is

    d = load_source(args.model).detail
    r = dino.study(d, size=args.size or 224)
    with Publish(Path(args.out), "heads", overwrite=args.overwrite, sources=(args.model,)) as folder:
        result = {"model": str(args.model), **r}
        distances = {f"{args.model} on {len(r['photos'])} photographs": (r["distance"], args.size or 224)}
        if compare is not None:
            result["compare"] = {"run": str(args.compare), "distance": compare[0].tolist()}
            distances[f"{Path(args.compare).name}: 1,000 test images"] = (compare[0], compare[1])
        atomic_write_json(folder / "heads.json", result)
        dino.plot_objects(r, folder / "objects", f"{args.model}: the last layer's [CLS] attention per head")
        dino.plot_distances(distances, folder / "distance", "mean attention distance per head against depth")
        dino.plot_norms(r, folder / "norms", f"{args.model}: patch-token norms in the residual stream")
    print(dino.format_study(r))
    if compare is not None:
        print(
            f"{args.compare}: mean attention distance per layer "
            + " ".join(f"{float(v):.1f}" for v in compare[0].mean(1))
        )
    print(f"wrote heads.json, objects.png, distance.png and norms.png to {args.out}")
    return 0


def heads_causal(args) -> int:
    """``multihead heads RUN`` for a causal LM run: induction heads (prefix matching and copying, stated rules in
    multihead.interpret.roles.induction), on repeated random tokens from the run's own vocabulary."""
    import json

    from .._io import Publish, atomic_write_json
    from ..data.tokenizer import SEP, SPECIALS
    from ..interpret.roles import induction as I
    from ..train.pretrain import load_pretrain_run

    run = load_pretrain_run(args.model)
    if run.config.objective.name != "clm":
        raise ValueError(
            f"{args.model} is a masked-LM run; its encoder's heads are analysed on text: multihead heads "
            f"{Path(args.model) / 'encoder'}"
        )
    half = max(2, min(64, (run.config.causal.max_len - 1) // 2))
    scores = I.induction_scores(
        run.model, half=half, batch=min(args.n, 64), low=len(SPECIALS) + 1, start=run.tokenizer.token_to_id(SEP)
    )
    result = {
        "model": str(args.model),
        "rule": f"induction: prefix-matching score >= {I.INDUCTION}",
        "half": half,
        "prefix_matching": scores["prefix_matching"].tolist(),
        "copying": scores["copying"].tolist(),
        "roles": I.induction_roles(scores["prefix_matching"]),
        "loss_first_half": scores["loss_first_half"],
        "loss_second_half": scores["loss_second_half"],
    }
    print(json.dumps(result) if args.json else I.format_scores(result))
    if args.out:
        with Publish(args.out, "heads", overwrite=args.overwrite, sources=(args.model,)) as folder:
            atomic_write_json(folder / "heads.json", result)
        print(f"wrote {Path(args.out) / 'heads.json'}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_importance(args) -> int | Route:
    return Route("importance", args.run)


def importance_run(args) -> int:
    """``importance RUN``: per-head importance of a trained run on its data."""
    from ..heads import scores as imp
    from ..train import tasks

    tasks.require(args.run, "importance")
    result = imp.score_run(
        args.run, args.method, data=args.data, split=args.split, n=args.n, out=Path(args.out) if args.out else None
    )
    print(imp.format_table(result["tensor"], result["title"]))
    print(f"wrote {result['json']} and {result['files'][0]}")
    return 0


def importance_media(args) -> int:
    """``multihead importance dinov2|whisper --out DIR``: :func:`multihead.interpret.causal.ablation.media_importance`."""
    from ..heads.scores import format_table
    from ..interpret.causal.ablation import media_importance

    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write importance-ablation.json and the pictures")
    r = media_importance(args.run, out=args.out, n=args.n, overwrite=args.overwrite)
    print(format_table(r["importance"], f"{args.run}: {r['rule']}"))
    for p in r["pruning"]:
        print(
            f"  {100 * p['fraction']:4.0f}% of heads masked ({p['heads_masked']:3d}): {r['curve_metric']} {p['score']:.4f}"
        )
    print(f"wrote importance-ablation.json, importance.png and pruning.png to {args.out}")
    return 0


def cmd_prune(args) -> int | Route:
    return Route("prune", args.run)


def prune_run(args) -> int:
    """``prune RUN``: iterative head pruning of a trained run, then a physically pruned run folder."""
    from .._proc import set_threads

    from ..heads import prune as P
    from ..train import tasks

    tasks.require(args.run, "prune")
    set_threads(args.threads)
    r = P.prune_run(
        args.run,
        Path(args.out),
        overwrite=args.overwrite,
        data=args.data,
        method=args.method,
        step=args.step,
        max_drop=args.max_drop,
        until=args.until,
        speed_at=args.speed_at,
        min_time=args.min_time,
    )
    speed = r["inference"]
    print(
        f"chosen: {r['pruned']}/{r['heads']} heads pruned ({r['fraction']:.0%}); test accuracy "
        f"{r['test_accuracy_pruned']:.4f} vs {r['base_test_accuracy']:.4f} unpruned; "
        f"|pruned - masked| = {r['max_abs_diff_pruned_vs_masked']:.1e}"
    )
    for name, sec in speed["seconds"].items():
        print(
            f"  inference {name:<14} {sec:7.3f}s per test pass ({speed['speedup_vs_unpruned'][name]:.2f}x), "
            f"batch 32, {speed['threads']} threads"
        )
    print(f"pruned run: {args.out} (pruning.json, pruning.png)")
    return 0


def _parser_show(sub) -> None:
    sh = sub.add_parser("show", help="pictures (PNG+SVG) and an offline web page of every head for one text")
    sh.add_argument(
        "model",
        help="a run folder (classifier, G2P or ViT), minilm, a BERT-family folder, a "
        "pretrained LM (smollm2, .gguf, HF folder), dinov2 (with --image PHOTO) or whisper "
        "(with --audio WAV)",
    )
    sh.add_argument("text", nargs="?", default="", help="the text (a word for G2P runs; none for image runs)")
    sh.add_argument("--index", type=_nonneg, default=None, help="image runs: this test image")
    sh.add_argument(
        "--image", default=None, help="image runs: a .png or .npy image; dinov2: any photograph (.jpg, .png)"
    )
    sh.add_argument(
        "--question",
        default=None,
        help='grounding runs: a question about the canvas, e.g. "where is the bag?" (default: the canvas\'s own)',
    )
    sh.add_argument(
        "--patch", default=None, help="image runs: ROW,COL of the patch whose attention is drawn (default the centre)"
    )
    sh.add_argument("--audio", default=None, help="whisper: a WAV file (its first 30 s)")
    sh.add_argument(
        "--size",
        type=_count,
        default=None,
        help="dinov2: side of the square centre crop in pixels (default 224; rounded down to whole 14-pixel patches)",
    )
    sh.add_argument("--out", default=None, help="folder to write (G2P runs: default RUN/show/WORD)")
    sh.add_argument("--heads", type=_head_list, default=None, help="heads to draw at full size, e.g. 1:8,5:3")
    sh.add_argument("--no-rollout", action="store_true", help="skip the attention-rollout picture")
    sh.add_argument(
        "--max-len",
        type=_count,
        default=None,
        help="tokens read (rotary models read any length; over 1,024 the page is built from statistics, no map)",
    )
    sh.add_argument("--overwrite", action="store_true", help="replace a folder of other files at --out")
    sh.set_defaults(fn=cmd_show)


def cmd_explain(args) -> int | Route:
    if args.layer is not None or args.head is not None:  # refused from the headers, before the model is read
        from ..pretrained import declared

        shape = declared(args.model)
        if shape is not None and args.layer is not None and args.layer >= shape[0]:
            raise ValueError(f"--layer {args.layer}: {args.model} has attention layers 0 to {shape[0] - 1}")
        if shape is not None and args.head is not None and args.head >= shape[1]:
            raise ValueError(f"--head {args.head}: {args.model}'s layers have heads 0 to {shape[1] - 1}")
    return Route("explain", args.model)


def explain_text(args) -> int:
    """``multihead explain TEXT``: the tutorial's steps on a real model's layer, one offline page."""
    from .._io import Publish, atomic_write_json, check_target
    from ..interpret import load_subject
    from ..interpret.pages.explain import explain, write_explain_page

    if args.serve:
        return _serve_explain(args)
    if args.text is None or not args.text.strip():
        raise ValueError(
            'pass a text to walk through, e.g. "The cat sat on the mat." (or --serve to type it in a page)'
        )
    if args.out is None:
        raise ValueError("pass --out FOLDER for explain.html (or --serve to open the page on a local server)")
    # an earlier page is replaced only with --overwrite (its --help says so)
    check_target(args.out, "show", overwrite=args.overwrite, sources=(args.model,), replace_own=False)
    data = explain(load_subject(args.model), args.text, layer=args.layer, head=args.head)
    with Publish(Path(args.out), "show", overwrite=args.overwrite, sources=(args.model,), replace_own=False) as folder:
        write_explain_page(data, folder / "explain.html")
        atomic_write_json(
            folder / "explain.json", {k: data[k] for k in ("model", "text", "tokens", "layer", "head", "why", "checks")}
        )
    print(
        f"{data['model']}, layer {data['layer']} head {data['head']} ({data['why']}): {len(data['tokens'])} tokens, "
        f"d_model {data['d_model']}, d_k {data['d_k']}; the page's arithmetic matches the model within "
        f"{max(data['checks'].values()):.1e}"
    )
    print(f"wrote {Path(args.out) / 'explain.html'}: open it in a browser")
    return 0


def _serve_explain(args) -> int:
    """``multihead explain --serve``: the page on 127.0.0.1, the model loaded once for every text typed in it."""
    import time

    from ..interpret import load_subject
    from ..interpret.pages.serve import Explainer, Server, bind

    if args.out is not None:
        raise ValueError("--serve writes no files; drop --out (or drop --serve to write explain.html)")
    import importlib.util

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise ValueError("--serve needs Starlette and uvicorn: pip install 'multihead[serve]'")
    text = args.text if args.text and args.text.strip() else "The cat sat on the mat."
    sock = bind(args.port)  # a taken port is refused before the model is read
    start = time.perf_counter()
    try:
        subject = load_subject(args.model)
        explainer = Explainer(subject)
        data, first = explainer.ask(text, args.layer, args.head)  # refusals (a bad --layer) before serving
    except BaseException:
        sock.close()
        raise
    server = Server(explainer, text, sock=sock, first=data)
    print(
        f"{subject.name} loaded and the first text explained {since_start():.1f} s after the command started "
        f"(reading the model and explaining {time.perf_counter() - start:.1f} s, the text alone {first:.2f} s); "
        "each text typed in the page costs only its own pass"
    )
    print(f"serving {server.url} (127.0.0.1 only); open it in a browser, Ctrl-C to stop", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0


def _parser_explain(sub) -> None:
    ex = sub.add_parser(
        "explain",
        help="one transformer block step by step with a real model's numbers (embeddings, X, Q/K/V, QK^T, scaling, "
        "mask, softmax, every head, weights x V, concat, W^O, the MLP, the residual stream, logits and sampling): "
        "one offline page, or --serve to type your own text",
    )
    ex.add_argument(
        "text", nargs="?", default=None, help='the text, e.g. "The cat sat on the mat." (with --serve: the first one)'
    )
    ex.add_argument(
        "--model",
        default="minilm",
        help="minilm (default), a BERT-family folder, a classifier run, or a pretrained LM (smollm2, .gguf, HF folder)",
    )
    ex.add_argument(
        "--layer", type=_nonneg, default=None, help="attention layer (default: the determiner -> noun head's)"
    )
    ex.add_argument("--head", type=_nonneg, default=None, help="head (default: the determiner -> noun head)")
    ex.add_argument("--out", default=None, help="folder for explain.html")
    ex.add_argument("--overwrite", action="store_true", help="replace an earlier page at --out")
    ex.add_argument(
        "--serve",
        action="store_true",
        help="instead of a file: a local web server (127.0.0.1 only) where you type the text and the model, "
        "loaded once, recomputes every step",
    )
    ex.add_argument("--port", type=_port, default=8765, help="--serve's port on 127.0.0.1 (0: any free one)")
    ex.set_defaults(fn=cmd_explain)


def _parser_heads(sub) -> None:
    hd = sub.add_parser("heads", help="per-head statistics and role labels over a corpus sample")
    hd.add_argument(
        "model",
        help="a run folder, minilm, a BERT-family folder, a pretrained LM (smollm2, .gguf, HF "
        "folder: IMDB test text cut into --n inputs of --max-len tokens), dinov2 "
        "(photographs) or whisper (synthesized speech)",
    )
    hd.add_argument("--data", default="rotten_tomatoes", help="built-in dataset or a .csv/.tsv/.jsonl file")
    hd.add_argument("--n", type=_count, default=200, help="texts to use (default 200)")
    hd.add_argument("--split", default="test", choices=["test", "all"], help="the fixed test split, or all rows")
    hd.add_argument("--text-column", default="text")
    hd.add_argument("--label-column", default="label")
    hd.add_argument("--max-len", type=_count, default=None, help="tokens per input (rotary models read any length)")
    hd.add_argument("--concat", action="store_true", help="join consecutive texts into inputs of --max-len tokens")
    hd.add_argument(
        "--from",
        dest="source",
        choices=["maps", "stats"],
        default=None,
        help="compute from full maps or from exact statistics in linear memory (default: stats above 1,024 tokens)",
    )
    hd.add_argument("--out", default=None, help="write heads.json and heads.png/.svg here")
    hd.add_argument(
        "--size", type=_count, default=None, help="dinov2: pixels on the photographs' shorter side (default 224)"
    )
    hd.add_argument("--compare", default=None, help="dinov2: a ViT run folder whose attention distance is drawn beside")
    hd.add_argument(
        "--sentences",
        type=_count,
        default=50,
        help="whisper: sentences spoken word by word by espeak-ng (half choose the heads, half measure them)",
    )
    kv = hd.add_argument_group("KV heads (pretrained LMs): which heads a head-aware KV cache keeps whole")
    kv.add_argument(
        "--kv",
        action="store_true",
        help="retrieval heads on needle-in-a-haystack prompts, echo and induction heads on random tokens, and the "
        "split of key/value heads (kv-heads.json, kv-heads.png)",
    )
    kv.add_argument(
        "--needles", type=_needles, default=6, help="needle prompts (default 6; 0: data-free scores only; at most 256)"
    )
    kv.add_argument("--needle-len", type=_count, default=2048, help="tokens per needle prompt (default 2048)")
    kv.add_argument(
        "--kv-fraction", type=_fraction, default=0.25, help="share of key/value heads that keep every key (0.25)"
    )
    kv.add_argument(
        "--kv-score",
        choices=["data-free", "retrieval", "fitted"],
        default="data-free",
        help="rank key/value heads by max(echo, induction) (no data), by the needles' retrieval score, or by "
        "DuoAttention's gates fitted on the needles by distillation (minutes)",
    )
    hd.add_argument("--json", action="store_true")
    hd.add_argument("--overwrite", action="store_true", help="replace a folder of other files at --out")
    hd.set_defaults(fn=cmd_heads)


def _method_option(p) -> None:
    """``--method``: the head scores of :data:`multihead.heads.scores.METHODS` (read only when asked)."""
    p.add_argument(
        "--method",
        default="michel",
        choices=LazyChoices("multihead.heads.scores", "METHODS"),
        metavar="METHOD",
        help="how a head is scored: %(choices)s (default %(default)s)",
    )


def _parser_importance(sub) -> None:
    im = sub.add_parser("importance", help="per-head importance of a trained run (layers x heads table + heatmap)")
    im.add_argument(
        "run",
        help="a run folder, a pretrained LM (smollm2, .gguf, HF folder: scored by perplexity on "
        "held-out IMDB text), dinov2 or whisper (by zero ablation, with the pruning curve)",
    )
    im.add_argument("--data", default=None, help="dataset (default: the run's own)")
    im.add_argument("--split", default="validation", help="train | validation | test | all")
    _method_option(im)
    im.add_argument("--n", type=_count, default=None, help="use the first N texts")
    im.add_argument("--out", default=None, help="folder for JSON + PNG (default RUN/importance)")
    im.add_argument("--overwrite", action="store_true", help="pretrained LMs: replace the folder at --out")
    im.set_defaults(fn=cmd_importance)


def _parser_prune(sub) -> None:
    pu = sub.add_parser("prune", help="iterative head pruning on validation, then a physically pruned run folder")
    pu.add_argument("run")
    pu.add_argument("--data", default=None, help="dataset (default: the run's own)")
    pu.add_argument("--out", required=True, help="folder for the pruned run")
    _method_option(pu)
    pu.add_argument("--step", type=_fraction, default=0.1, help="fraction of remaining heads masked per round")
    pu.add_argument("--max-drop", type=_fraction, default=0.01, help="largest validation accuracy loss accepted")
    pu.add_argument("--until", type=_fraction, default=0.0, help="continue the curve until this fraction is pruned")
    pu.add_argument(
        "--speed-at",
        type=_fraction,
        default=None,
        help="also time a model pruned to this fraction (e.g. 0.5), from the curve",
    )
    pu.add_argument("--min-time", type=_seconds, default=3.0, help="seconds of timing per model")
    pu.add_argument("--threads", type=_threads, default=None)
    pu.add_argument(
        "--fractions",
        type=_fraction,
        nargs="+",
        default=[0.2, 0.4],
        help="pretrained LMs: fractions of query heads pruned (whole GQA groups)",
    )
    pu.add_argument("--n", type=_count, default=None, help="pretrained LMs: rows of 256 held-out tokens to score on")
    pu.add_argument(
        "--save",
        action="store_true",
        help="HF folders read by transformers: also write each pruned model as an HF folder transformers loads "
        "(OUT/pruned-FRACTION), checked against the pruned model's logits",
    )
    pu.add_argument("--overwrite", action="store_true", help="replace an existing run at --out")
    pu.set_defaults(fn=cmd_prune)


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    _parser_show(sub)
    _parser_explain(sub)
    _parser_heads(sub)
    _parser_importance(sub)
    _parser_prune(sub)
