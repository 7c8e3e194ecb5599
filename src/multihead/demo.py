"""The tutorial's walk-through, run for real: shapes, per-head weights for "The cat sat on the mat.", parity with
PyTorch, the fully-masked-row fix, and the classifier. Writes a PNG and a JSON summary to the run folder."""

from __future__ import annotations

from ._io import atomic_write_json

import time
from pathlib import Path

import torch
from torch import nn

from .attention import explain, explain_choice, list_backends
from .attention.patterns import SparsePattern
from .modules import MultiHeadAttention
from .plotting import save as save_figure

SENTENCE = "The cat sat on the mat."


def walkthrough(out: Path, seed: int = 0, run: Path | None = None) -> dict:
    """The tutorial's call, the backends, a trained model's heads on the tutorial's sentence (MiniLM; without its
    package, the classifier trained in ``run``) with the tutorial's steps as a page, parity with PyTorch, the fully
    masked row, and the fused path's speed."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    summary: dict = {}

    print("1. Multi-head attention, the tutorial's call: o, w = MultiHeadAttention(512, 8)(torch.rand(2, 5, 512))")
    o, w = MultiHeadAttention(512, 8)(torch.rand(2, 5, 512))
    print(f"   output {tuple(o.shape)}, per-head weights {tuple(w.shape)}")
    summary["tutorial_shapes"] = {"output": list(o.shape), "weights": list(w.shape)}

    print("2. Backends registered:", ", ".join(f"{n} ({b.description})" for n, b in list_backends().items()))
    q = torch.randn(1, 8, 5, 64)
    for name, reason in explain(q, q, need_weights=False):
        print(f"   auto, no weights: {name}: {'usable' if reason is None else 'skipped, ' + reason}")
    print(
        f"   a sliding window on this CPU: {explain_choice(q, q, mask=SparsePattern(window=2))} (rank: the order in "
        "which auto tries backends) "
        "(on CUDA: FlexAttention; docs/efficient-attention.md, 'On the GPU')"
    )

    print(f'3. Per-head weights for "{SENTENCE}" in a trained model, and the tutorial\'s steps with its numbers')
    summary["cat_sat"] = _trained_heads(out, run)

    print("4. Parity with nn.MultiheadAttention (weights copied with from_torch)")
    ref = nn.MultiheadAttention(512, 8, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(4, 33, 512)
    with torch.no_grad():
        diff = (ours(x)[0] - ref(x, x, x)[0]).abs().max().item()
    print(f"   max |ours - torch| = {diff:.2e}")
    summary["torch_parity_max_abs"] = diff

    print("5. A fully padded sequence: PyTorch returns NaN (pytorch/pytorch#41508), multihead returns zeros")
    pad = torch.zeros(1, 33, dtype=torch.bool)
    with torch.no_grad():
        t_nan = torch.isnan(ref(x[:1], x[:1], x[:1], key_padding_mask=~pad)[0]).any().item()
        o_ours, _ = ours(x[:1], key_padding_mask=pad)
    print(f"   torch NaN: {t_nan}; multihead NaN: {torch.isnan(o_ours).any().item()}")
    summary["fully_masked"] = {"torch_nan": bool(t_nan), "multihead_nan": bool(torch.isnan(o_ours).any())}

    print("6. Speed of the fused path vs the tutorial's explicit softmax, forward, L=1024, batch 2")
    from .tutorial import TutorialMultiHeadAttention

    tut = TutorialMultiHeadAttention(512, 8).eval()
    fused = MultiHeadAttention(512, 8, need_weights=False).eval()
    x = torch.randn(2, 1024, 512)
    timings = {}
    for name, fn in (
        ("tutorial", lambda: tut(x)),
        ("multihead", lambda: fused(x)),
        ("torch_mha_fast_path", lambda: ref(x, x, x, need_weights=False)),
    ):
        with torch.no_grad():
            fn()
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
        timings[name] = (time.perf_counter() - t0) / 3
    for name, t in timings.items():
        print(f"   {name:<20} {1e3 * t:8.1f} ms  ({t / timings['multihead']:.2f}x multihead)")
    summary["forward_ms_L1024"] = {k: 1e3 * v for k, v in timings.items()}
    atomic_write_json(out / "demo.json", summary)
    print(f"summary: {out / 'demo.json'}")
    return summary


def _trained_heads(out: Path, run: Path | None) -> dict:
    """A trained model's heads on the tutorial's sentence: the layer of its determiner -> noun head (the one that
    passes :mod:`multihead.interpret.roles.evidence`), every head
    drawn with that one outlined (``cat_sat_heads.png``), and the tutorial's steps on that head as a page
    (``explain.html``, :mod:`multihead.interpret.pages.explain`)."""
    from .interpret import load_subject
    from .interpret.pages.explain import explain, write_explain_page
    from .pretrained import PretrainedError

    try:
        subject, what = load_subject("minilm"), "MiniLM-L6 (pretrained)"
    except PretrainedError as exc:
        if run is None:
            print(f"   skipped: {exc}")
            return {"skipped": str(exc)}
        print(f"   (MiniLM is not installed, {exc}; the classifier trained in step 1 instead)")
        subject, what = load_subject(run), "the demo's classifier (trained in step 1)"
    d = explain(subject, SENTENCE)
    tokens, weights = d["tokens"], torch.tensor(d["weights"])
    l, h = d["layer"], d["head"]
    print(f"   {what}, layer {l} of {d['layers']}, head {h}: {d['why']}")
    for head in range(weights.shape[0]):
        top = weights[head].argmax(-1).tolist()
        links = ", ".join(f"{tokens[i]}->{tokens[j]}" for i, j in enumerate(top))
        print(f"   {'*' if head == h else ' '} head {head:>2}: each token's strongest link: {links}")
    png = out / "cat_sat_heads.png"
    _plot_heads(weights, tokens, png, title=f'{what}, layer {l}: every head on "{SENTENCE}"', chosen=h)
    page = write_explain_page(d, out / "explain.html")
    print(f"   heatmaps: {png} (* and the red frame: head {h}); the tutorial's steps with these numbers: {page}")
    return {"model": what, "layer": l, "head": h, "tokens": tokens, "png": str(png), "explain": str(page)}


def _plot_heads(weights: torch.Tensor, tokens: list[str], path: Path, *, title: str, chosen: int) -> None:
    """Every head of one layer (rows: queries, columns: keys), one colour scale with its bar, ``chosen`` framed."""
    from .plotting import plain, pyplot

    plt = pyplot()

    h = weights.shape[0]
    cols = 4 if h <= 8 else 6
    rows = (h + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.6 * cols + 1, 2.6 * rows + 0.8), squeeze=False, layout="constrained"
    )
    image = None
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        if i >= h:
            ax.axis("off")
            continue
        image = ax.imshow(weights[i].numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(
            f"head {i}" + (": determiner -> noun" if i == chosen else ""),
            fontsize=8,
            color="#d62728" if i == chosen else "black",
        )
        ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
        if i == chosen:
            for side in ax.spines.values():
                side.set_edgecolor("#d62728")
                side.set_linewidth(2.5)
    fig.colorbar(image, ax=axes, fraction=0.02, pad=0.01, label="attention weight (each row sums to 1)")
    fig.suptitle(plain(title) + " (rows: queries, columns: keys)", fontsize=10)
    save_figure(fig, path, formats=("png",), dpi=100)


def _threads(threads: int | None) -> int | None:
    """The thread count for the demo: ``threads`` if given; on a busy machine one thread (with 2 threads and other
    work on 2 cores, an epoch ran 6-15x slower than with 1), said so; else PyTorch's choice."""
    import os

    from ._proc import set_threads

    if threads is None and hasattr(os, "getloadavg"):
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
        if load >= 0.75 * cpus:
            threads = 1
            print(
                f"   the machine is busy (load {load:.1f} on {cpus} CPUs): the demo uses 1 thread, which suffers "
                "least from the other work; every step will still be slower than the times in the README. Pass "
                "--threads N to choose, or run it when the machine is idle"
            )
    set_threads(threads)
    return threads


def run_demo(
    out: Path, *, seed: int = 0, limit: int | None = None, epochs: int | None = None, threads: int | None = None
) -> dict:
    """``make demo``: train the default classifier on rotten_tomatoes into ``out`` (test accuracy beside the TF-IDF
    baseline), then the attention walk-through into ``out/walkthrough``. Later steps add to the same run folder."""
    from ._io import FolderError, folder_kind
    from .train import TrainConfig, train

    out = Path(out)
    if folder_kind(out) not in ("missing", "empty", "run"):  # the demo replaces a run, never other files
        raise FolderError(
            f"--out {str(out)!r} holds files that are not a multihead run; the demo writes (and "
            "replaces) a run folder there: choose another --out"
        )
    threads = _threads(threads)
    config = TrainConfig()
    config.run.seed, config.run.threads = seed, threads
    config.data.limit = config.data.eval_limit = limit
    if epochs is not None:
        config.optim.epochs = epochs
    steps: list[tuple[str, float]] = []
    clock = [time.perf_counter()]

    def done(name: str) -> None:
        now = time.perf_counter()
        steps.append((name, now - clock[0]))
        clock[0] = now

    print(f"== 1. Train a Transformer classifier from scratch on {config.data.name} -> {out}")
    t0 = time.perf_counter()
    results = train(config, out, overwrite=True)
    test, base = results["test"], results["baseline_tfidf_logreg"]
    print(
        f"   test accuracy {test['accuracy']:.4f} (macro-F1 {test['macro_f1']:.4f}, n={test['n']}); "
        f"TF-IDF + logistic regression on the same split: {base.get('test_accuracy', float('nan')):.4f}; "
        f"{time.perf_counter() - t0:.0f}s"
    )
    if test["accuracy"] <= base.get("test_accuracy", 0.0):
        print(
            "   below the TF-IDF baseline, and it stays there: a Transformer trained from scratch on 8,530 short "
            "sentences scores 0.744 +- 0.010 over seeds 0-4 against TF-IDF's 0.758 (one run's standard error on 852 "
            "test sentences is about 1.5 points); it is here to be looked inside. Pretrained weights beat the "
            "baseline: multihead train --init minilm --data rotten_tomatoes --out runs/minilm-rt reaches 0.823"
        )
    print(f"   run folder: {out} (model.safetensors, config.json, metrics.jsonl, curves.png, confusion.png)")
    done("classifier")
    print(f"== 2. Inside multi-head attention -> {out / 'walkthrough'}")
    summary = walkthrough(out / "walkthrough", seed=seed, run=out)
    done("walkthrough")
    print(f"== 3. Real pretrained heads: MiniLM-L6 (6 layers x 12 heads) in our modules -> {out / 'pretrained'}")
    real = pretrained_step(out / "pretrained")
    done("MiniLM")
    print(f'== 4. Seeing inside: "{SENTENCE}" in the trained classifier and in MiniLM')
    seen = show_step(out, pretrained_ok="skipped" not in real)
    done("seeing inside")
    print("== 5. Heads, measured: which heads of the demo classifier matter, and pruning them")
    measured = heads_step(out)
    done("heads and pruning")
    print(
        f"== 6. MHA in the decoder: causal self-attention + cross-attention, grapheme-to-phoneme on CMUdict "
        f"-> {out / 'g2p'}"
    )
    g2p = g2p_step(out / "g2p", seed=seed, limit=limit, epochs=epochs)
    done("G2P")
    print(f"== 7. MHA beyond text: a Vision Transformer on images of digits, and where its heads look -> {out / 'vit'}")
    vision = vision_step(out / "vit", seed=seed, limit=limit, epochs=epochs)
    done("ViT")
    print("== 8. Long inputs: exact per-head statistics from the fast path, no L x L map")
    stats = stats_step(seed=seed)
    done("long-input statistics")
    print(
        f"== 9. A real pretrained LM: SmolLM2-135M (GGUF) in our decoder, a continuation and its induction heads "
        f"-> {out / 'smollm2'}"
    )
    smol = smollm2_step(out / "smollm2")
    done("SmolLM2")
    print(
        f"== 10. Real pretrained vision and speech: DINOv2-small's [CLS] heads on a photograph, Whisper tiny.en's "
        f"transcript with word times -> {out / 'media'}"
    )
    media = media_step(out / "media")
    done("DINOv2 and Whisper")
    total = sum(t for _, t in steps)
    print(f"== Done in {total / 60:.1f} min: " + ", ".join(f"{n} {t:.0f}s" for n, t in steps))
    print(f"   everything is in {out}; open first, in a browser:")
    firsts = [
        (
            out / "pretrained" / "show" / "attention.html",
            "MiniLM's heads on the cat sentence; it opens on the head that passed the determiner -> noun test "
            "(sentences where the noun is not the next word)",
        ),
        (
            out / "walkthrough" / "explain.html",
            "one transformer block step by step (embeddings, Q K V to W^O, every head, the MLP, the residual stream) with that head's own numbers; type your own text with: multihead explain --serve",
        ),
        (
            out / "smollm2" / "attention.html",
            "SmolLM2 reading a sentence twice; it opens on its strongest induction "
            "head, which looks back to the word after the earlier copy",
        ),
        (out / "walkthrough" / "cat_sat_heads.png", "every head of that MiniLM layer at once"),
    ]
    for n, (path, what) in enumerate((p, w) for p, w in firsts if p.exists()):
        print(f"   {n + 1}. {path}: {what}")
    print(
        f"   then {out / 'show' / 'attention.html'} (the classifier trained in step 1), {out / 'vit'} and "
        f"{out / 'media'} for pictures, and {out / 'g2p'} for the decoder's alignments"
    )
    return {
        "train": results,
        "walkthrough": summary,
        "pretrained": real,
        "show": seen,
        "heads": measured,
        "g2p": g2p,
        "vision": vision,
        "stats": stats,
        "smollm2": smol,
        "media": media,
        "seconds": {n: round(t, 1) for n, t in steps},
    }


DEMO_SPEECH = "The cat sat on the mat and looked at the door."


def media_step(out: Path) -> dict:
    """DINOv2-small on scikit-image's cat: the last layer's [CLS] attention per head over the photograph; Whisper
    tiny.en on a sentence espeak-ng speaks: the transcript and word times from its alignment heads."""
    from .interpret.media import dino
    from .interpret.media import speech

    result: dict = {}
    out.mkdir(parents=True, exist_ok=True)
    try:
        from .loading import load as load_source  # the one loader: it knows what a source is

        d = load_source("dinov2").detail
        r = dino.study(d, names=("chelsea",))
        p = r["photos"]["chelsea"]
        dino.plot_objects(r, out / "dinov2-cat", "DINOv2-small: the last layer's [CLS] attention per head")
        best = max(range(len(p["share"])), key=lambda h: p["share"][h])
        print(
            f"   DINOv2-small ({len(d.model.encoder.layers)} layers x {d.model.config.encoder.num_heads} heads): on "
            f"the cat, head {best} puts {p['share'][best]:.0%} of the last layer's [CLS] attention inside the cat's "
            f"box, which covers {p['area']:.0%} of the picture ({p['share'][best] / max(p['area'], 1e-9):.2f}x "
            f"uniform attention) -> {out / 'dinov2-cat.png'}"
        )
        result["dinov2"] = {"share": p["share"], "area": p["area"]}
    except ValueError as exc:  # the package missing (Dinov2Error), or scikit-image
        print(f"   DINOv2 skipped: {exc}")
        result["dinov2"] = {"skipped": str(exc)}
    try:
        from .loading import load as load_source  # the one loader: it knows what a source is

        w = load_source("whisper").detail
        audio = speech.speak(DEMO_SPEECH)
        text = w.transcribe(audio)["text"]
        words = speech.word_timestamps(w, audio, text, w.timing_heads)
        print(f"   Whisper tiny.en heard: {text!r}")
        print("   " + " ".join(f"{x['word']}@{x['start']:.2f}s" for x in words))
        result["whisper"] = {"spoken": DEMO_SPEECH, "heard": text, "words": words}
    except ValueError as exc:  # the package missing (WhisperError), or espeak-ng
        print(f"   Whisper skipped: {exc}")
        result["whisper"] = {"skipped": str(exc)}
    print(
        "   more: multihead show dinov2 --image photo.jpg --out runs/photo; multihead transcribe whisper speech.wav "
        "--timestamps; multihead heads dinov2|whisper --out DIR"
    )
    atomic_write_json(out / "media.json", result)
    return result


LM_PROMPT = "The three primary colours of light are"


def smollm2_step(out: Path) -> dict:
    """SmolLM2-135M from its GGUF file: a greedy continuation, then every head's prefix-matching score on repeated
    random tokens, and the ablation check (the top induction heads masked vs as many random heads)."""
    from .interpret.roles import induction as I
    from .models.generation import generate
    from .pretrained import SourceError

    try:
        from .loading import load as load_source  # the one loader: it knows what a source is

        p = load_source("smollm2").detail
    except SourceError as exc:  # the package missing (its install line), or its file unreadable
        print(f"   skipped: {exc}")
        return {"skipped": str(exc)}
    c = p.model.config
    print(
        f"   loaded {p.path.name}: {c.decoder.num_layers} layers x {c.decoder.num_heads} query heads "
        f"({c.decoder.attention.num_kv_heads} key/value heads), RMSNorm, SwiGLU, rotary base {c.decoder.rope_theta:g}"
    )
    ids = p.encode(LM_PROMPT)
    new = generate(p.model, torch.tensor([ids]), None, max_new_tokens=24, stop_tokens=p.eos_ids).tokens[0]
    text = p.decode(new)
    print(f"   {LM_PROMPT!r} -> {text!r}")
    scores = I.induction_scores(p.model, half=32, batch=4, low=1000, start=1000)
    check = I.ablation(p.model, scores["prefix_matching"], k=8, half=32, batch=4, low=1000, start=1000)
    pm = scores["prefix_matching"]
    heads = [(l, h, float(pm[l, h])) for l in range(pm.shape[0]) for h in range(pm.shape[1])]
    passing = sorted((x for x in heads if x[2] >= I.INDUCTION), key=lambda x: -x[2])
    print(
        f"   induction heads (prefix matching >= {I.INDUCTION}): {len(passing)} of {len(heads)}: "
        + ", ".join(f"L{l}H{h} {v:.2f}" for l, h, v in passing[:6])
    )
    print(
        f"   masking the top 8 raises the repeated half's loss {check['base']:.2f} -> {check['top']:.2f}; "
        f"8 random heads: {check['random_mean']:.2f}"
    )
    kv = _kv_cache_check(p)
    print(
        '   more: multihead generate smollm2 "Hello" --chat; multihead induction --model smollm2 --out runs/ind; '
        "multihead sinks smollm2 --out runs/sinks; multihead heads smollm2 --kv; multihead kv smollm2"
    )
    out.mkdir(parents=True, exist_ok=True)
    if passing:
        page = _induction_page(p, passing[:3], out / "attention.html")
        print(f"   {page}: a sentence read twice, the page opened on induction head L{passing[0][0]}H{passing[0][1]}")
    result = {
        "prompt": LM_PROMPT,
        "continuation": text,
        "prefix_matching": pm.tolist(),
        "copying": scores["copying"].tolist(),
        "ablation": check,
        "induction_heads": [{"layer": l, "head": h, "prefix_matching": round(v, 4)} for l, h, v in passing],
        "kv_cache": kv,
    }
    I.plot_scores(result, out / "induction.png", "SmolLM2-135M: induction heads on repeated random tokens")
    atomic_write_json(out / "smollm2.json", result)
    return result


def _kv_cache_check(p) -> dict:
    """Heads decide the cache: one needle answered from the full cache, a uniform window and the head-aware mix at
    the same budget (:func:`multihead.interpret.kv.curves.needle_check`), said plainly either way."""
    from .interpret.kv.curves import needle_check

    r = needle_check(p, length=1024, budget=128)
    c = r["caches"]
    kept = sum(len(x) for x in r["full_heads"])
    print(
        f"   heads decide the cache: a 7-digit number hidden 30% into {r['length']} tokens of reviews, asked for at "
        f"the end; {kept} key/value heads (the top quarter by echo/induction, found without data) keep every key"
    )
    for name, what in (("full", "every key"), ("window", f"{r['budget']} keys per head"), ("head-aware", "the mix")):
        x = c[name]
        print(
            f"     {name:<10} ({what}, {x['share']:.0%} of the bytes): {x['answer']!r} {'right' if x['right'] else 'wrong'}"
        )
    if c["head-aware"]["right"] and not c["window"]["right"]:
        print("   the head-aware cache keeps the answer that the uniform window of the same budget loses")
    elif not c["full"]["right"]:
        print("   the model misses this needle even with every key: nothing for a smaller cache to keep")
    else:
        print(
            "   on this needle the head-aware cache does not beat the window of the same budget; `multihead kv "
            "smollm2` measures every policy over many needles and lengths"
        )
    return r


REPEATED = "The old lighthouse keeper painted the red door every spring."


def _induction_page(p, heads: list[tuple[int, int, float]], path: Path) -> Path:
    """The attention page of ``p`` on a sentence read twice, the given induction heads highlighted (the page opens
    on the first): in the second copy each of them looks at the token after the same token's earlier occurrence."""
    from .interpret.maps import LMSubject
    from .interpret.pages.page import write_page

    subject = LMSubject("SmolLM2-135M", p.model, p.tokenizer, p.model.config.max_len, lm=p)
    maps = subject.maps(f"{REPEATED} {REPEATED}")
    captions = {
        (l, h): f"induction head (prefix matching {v:.2f} on repeated random tokens): in the second copy, each word "
        "looks at the word that followed it the first time"
        for l, h, v in heads
    }
    return write_page(maps, path, highlights=captions)


def stats_step(*, seed: int = 0, length: int = 4096) -> dict:
    """``attention_stats`` on one causal layer's q, k at ``length`` tokens (8 heads, head dim 64): exact against
    the full map at 1,024 tokens, then at ``length`` where the map would take GiBs."""
    from .attention import attention_weights
    from .attention.stats import attention_stats

    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 8, length, 64, generator=g), torch.randn(1, 8, length, 64, generator=g)
    q[:, :, :, :8] += 3.0  # a shared direction: some structure in the scores
    k[:, :, :, :8] += 3.0
    small = attention_stats(q[:, :, :1024], k[:, :, :1024], is_causal=True, topk=4)
    p = attention_weights(q[:, :, :1024].double(), k[:, :, :1024].double(), is_causal=True)
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)
    diff = (small.entropy.double() - ent).abs().max().item()
    print(f"   1,024 tokens: entropy from tiles vs from the full fp64 map: max difference {diff:.1e}")
    t0 = time.perf_counter()
    st = attention_stats(q, k, is_causal=True, topk=4)
    seconds = time.perf_counter() - t0
    map_gib = 8 * length * length * 4 / 2**30
    print(
        f"   {length:,} tokens, causal: entropy, received mass, distance, first-token mass and top-4 keys of every "
        f"query of 8 heads in {seconds:.1f}s, {st.nbytes() / 2**20:.1f} MiB of results (the map alone: "
        f"{map_gib:.1f} GiB)"
    )
    first = st.mass["first"].mean(-1)[0]
    print(
        "   per head: mean entropy (nats) "
        + " ".join(f"{v:.2f}" for v in st.entropy.mean(-1)[0].tolist())
        + "; first-token share "
        + " ".join(f"{v:.3f}" for v in first.tolist())
    )
    return {"length": length, "seconds": seconds, "max_entropy_error_1024": diff, "map_gib": map_gib}


def vision_step(out: Path, *, seed: int = 0, limit: int | None = None, epochs: int | None = None) -> dict:
    """A hybrid ViT trained with the quick preset on scikit-learn's digits (``multihead train --data digits --preset
    quick``), its test accuracy beside logistic regression on the pixels, and its attention on one test image.
    Digits, not Fashion-MNIST: in the minutes a demo step has, no recipe tried on Fashion-MNIST beat the pixel
    baseline (the quick preset: 0.767 against 0.834); the full recipe does (0.8998 in 20 minutes), and the step says
    where it is. ``limit``/``epochs`` (a smoke run) cap the images and the epochs."""
    from .interpret.media.vision import attention_distance, show_image
    from .train import presets
    from .train.config import merge
    from .train.vision import config_from_overrides, held_out_images, load_vision_run, train_vision

    data = "digits"
    config = config_from_overrides(merge(presets.preset("vision", "quick", data), {"data": {"name": data}}))
    config.run.seed, config.run.progress = seed, True  # a bar per epoch (it clears when the epoch ends)
    if limit:
        config.data.limit = config.data.eval_limit = min(limit, config.data.limit or limit)
    if epochs:
        config.optim.epochs = epochs
    t0 = time.perf_counter()
    results = train_vision(config, out, overwrite=True)
    base = results["baseline_pixels_logreg"]
    acc = results["test"]["accuracy"]
    verdict = (
        "above"
        if acc > base["accuracy"]
        else "NOT above (the test split has 179 images, one is 0.006: over seeds 0-2 this preset scored 0.994, 0.994 "
        "and 0.972 against 0.978; a smoke run with fewer epochs stays below)"
    )
    print(
        f"   {results['parameters']:,} parameters, {results['train_minutes']:.1f} min on {results['images']['train']:,} "
        f"8x8 digit images: test accuracy {acc:.4f}, {verdict} logistic regression on the pixels of the same split "
        f"({base['accuracy']:.4f})"
    )
    run = load_vision_run(out)
    images, labels = held_out_images(run)
    summary = show_image(
        run.model, images[:1], run.labels, out / "show", truth=run.labels[int(labels[0])], name="test-0"
    )
    dist = attention_distance(run.model, images[:500])
    print(f"   test image 0: predicted {summary['predicted']} (true {summary['true']}); pictures in {out / 'show'}")
    print(
        "   Fashion-MNIST (28x28 photographs of clothes): multihead train --data fashion_mnist --out runs/fashion "
        "reaches 0.8998 test accuracy in 19.9 minutes on 2 cores; in the 3 minutes a demo step has, its quick preset "
        "reaches 0.767, below logistic regression on the pixels (0.834), which is why the demo trains digits"
    )
    print(
        "   mean attention distance per head (pixels), layer by layer: "
        + "; ".join(" ".join(f"{v:.1f}" for v in d.tolist()) for d in dist)
        + f"; {time.perf_counter() - t0:.0f}s"
    )
    return {
        "results": {k: results[k] for k in ("test", "train_minutes", "parameters", "baseline_pixels_logreg")},
        "predicted": summary["predicted"],
        "distance": [d.tolist() for d in dist],
    }


G2P_WORDS = ("attention", "multihead", "photograph", "transformer")


def g2p_step(out: Path, *, seed: int = 0, limit: int | None = None, epochs: int | None = None) -> dict:
    """A small encoder-decoder trained for about two minutes on CMUdict with the quick preset (``multihead train
    --data cmudict --preset quick``), its pronunciations, and where its cross-attention looks. ``limit``/``epochs``
    (a smoke run) cap the words and the epochs."""
    from .interpret.media.g2p import show_g2p
    from .train import presets
    from .train.g2p import config_from_overrides, load_g2p_run, predict_words, train_g2p

    config = config_from_overrides(presets.preset("g2p", "quick", "cmudict"))
    config.run.seed, config.run.progress = seed, True
    if limit:
        config.data.limit = config.data.test_limit = config.run.eval_words = min(limit, 1000)
        config.data.eval_limit = config.data.limit
    if epochs:
        config.optim.epochs = epochs
    t0 = time.perf_counter()
    results = train_g2p(config, out, overwrite=True)
    g, b = results["test_greedy"], results["test_beam"]
    print(
        f"   {results['params']:,} parameters, {results['train_minutes']:.1f} min on "
        f"{results['words']['train']:,} words: test ({g['words']} words) greedy WER {g['wer']:.3f} PER "
        f"{g['per']:.3f} (without stress marks {g['wer_no_stress']:.3f}), beam 3 WER {b['wer']:.3f} PER {b['per']:.3f}"
    )
    run = load_g2p_run(out)
    for row in predict_words(run, list(G2P_WORDS)):
        print(f"   {row['word']:<12} {row['phonemes']}")
    summary = show_g2p(
        run, "photograph", out / "show", sample=100, overwrite=True, log=lambda text: print("   " + text)
    )
    print(
        f"   pictures and pages: {out / 'show'} (cross.html: letters on one side, phonemes on the other); "
        f"{time.perf_counter() - t0:.0f}s. The full model: multihead train --data cmudict --out runs/g2p"
    )
    return {"results": results, "show": {k: summary[k] for k in ("word", "phonemes", "monotonicity")}}


def heads_step(out: Path) -> dict:
    """Michel importance of the demo run's heads, then iterative pruning into ``out/pruned`` (curve + timing)."""
    from .heads import prune as P
    from .heads import scores

    imp = scores.score_run(out, "michel", progress=False)
    print(
        "   importance of each head (Michel et al. 2019: how much the validation loss moves when the head's output is "
        "scaled, |d loss / d mask|, normalised per layer):"
    )
    print("   " + scores.format_table(imp["tensor"], imp["title"]).replace("\n", "\n   "))
    curve = P.prune_run(
        out, out / "pruned", max_drop=0.01, until=1.0, min_time=1.0, log=lambda text: print("   " + text)
    )
    sp = curve["inference"]["speedup_vs_unpruned"]["pruned"]
    print(
        f"   kept within 1 validation point: {curve['pruned']}/{curve['heads']} heads pruned; test accuracy "
        f"{curve['test_accuracy_pruned']:.4f} (unpruned {curve['base_test_accuracy']:.4f}); inference "
        f"{sp:.2f}x as fast as the unpruned model -> {out / 'pruned'} (pruning.png); for MiniLM: multihead prune RUN "
        "--out RUN-pruned"
    )
    return {"importance": imp["scores"], "pruned": curve["pruned"], "test_accuracy": curve["test_accuracy_pruned"]}


def show_step(out: Path, *, pretrained_ok: bool = True) -> dict:
    """``multihead show`` on the demo run and on MiniLM (case study: which heads link the->cat, sat->on, cat->mat),
    and MiniLM's head roles over 200 Rotten Tomatoes test sentences."""
    from . import data as D
    from .interpret import load_subject
    from .interpret.roles import scores as roles
    from .interpret.pages.show import show

    done = {}
    targets = [(str(out), load_subject(out), out / "show")]
    minilm = load_subject("minilm") if pretrained_ok else None  # loaded once, for the pictures and the roles
    if minilm is not None:
        targets.append(("minilm", minilm, out / "pretrained" / "show"))
    names = {str(out): "the demo's classifier (trained in step 1)", "minilm": "MiniLM-L6 (pretrained)"}
    for source, subject, folder in targets:
        print(f"   {names.get(str(source), source)}: the heads that make the tutorial's links")
        summary = show(subject, SENTENCE, folder, log=lambda text: print("   " + text.replace("\n", "\n   ")))
        print(
            f"   {source}: {len(summary['files'])} files in {folder} ({summary['seconds']['total']:.1f}s); "
            f"open {folder / 'attention.html'}"
        )
        done[str(source)] = {k: summary[k] for k in ("tokens", "heads", "seconds")}
    if minilm is not None:
        texts = D.split(D.load("rotten_tomatoes"), seed=0).test.texts[:200]
        result = roles.analyse(minilm.maps(texts))
        roles.write(result, out / "pretrained" / "heads")
        print(
            "   MiniLM head roles on 200 rotten_tomatoes test sentences: "
            + ", ".join(f"{r} {c}" for r, c in result["counts"].items() if c)
            + f" -> {out / 'pretrained' / 'heads' / 'heads.png'}"
        )
        done["roles"] = result["counts"]
    return done


SIMILARITY_TEXTS = [
    "The cat sat on the mat.",
    "A cat was sitting on a rug.",
    "The film was a joy to watch.",
    "Stock markets fell sharply today.",
]


def pretrained_step(out: Path) -> dict:
    """Load MiniLM into our encoder, show its tokens and sentence-embedding similarities (a check that the weights
    sit in the right places: unrelated sentences come out far apart, paraphrases close)."""
    from . import pretrained

    out.mkdir(parents=True, exist_ok=True)
    try:
        from .loading import load as load_source  # the one loader: it knows what a source is

        p = load_source("minilm").detail
    except (pretrained.PretrainedError, pretrained.SourceError) as exc:
        print(f"   skipped: {exc}")
        return {"skipped": str(exc)}
    n_params = sum(t.numel() for t in p.model.parameters())
    print(f"   loaded {p.path} ({n_params / 1e6:.1f}M parameters; ignored: {', '.join(p.ignored) or 'nothing'})")
    tokens = p.tokens(SENTENCE)
    print(f"   tokens: {' '.join(tokens)}")
    sims = p.embed(SIMILARITY_TEXTS) @ p.embed(SIMILARITY_TEXTS).T  # (N, N) cosine of unit vectors
    print("   sentence-embedding cosine similarity (mean pooling, as sentence-transformers):")
    for i, text in enumerate(SIMILARITY_TEXTS):
        print(f"     {text:<34}" + " ".join(f"{v:6.3f}" for v in sims[i].tolist()))
    print("   fine-tune it: multihead train --init minilm --data rotten_tomatoes --out runs/minilm-rt")
    summary = {
        "path": str(p.path),
        "parameters": n_params,
        "tokens": tokens,
        "texts": SIMILARITY_TEXTS,
        "cosine": [[round(v, 4) for v in row] for row in sims.tolist()],
    }
    atomic_write_json(out / "pretrained.json", summary)
    return summary


__all__ = ["run_demo", "walkthrough"]
