"""The findings multihead measures, each registered once with its claim and figure."""

from __future__ import annotations

from pathlib import Path

from . import sinks as S
from .icl import ABLATIONS
from .registry import Finding, register


def _figure(panels: int):
    from ...plotting import pyplot

    plt = pyplot()
    return plt.subplots(1, panels, figsize=(5.2 * panels, 4))


def _save(fig, path: Path) -> None:
    from ...plotting import save

    fig.tight_layout()
    save(fig, path)


# ------------------------------------------------------------------------------------------------- sink-length
def _run_length(model, text, options: dict, progress) -> dict:
    count = options.get("needles", 0)
    needles_at = None if not count or text.needles is None else (lambda n: text.needles(n, count))
    return S.sink_length(model, text.rows, options["lengths"], progress, needles_at)


def _plot_length(payload: dict, path: Path) -> None:
    lengths = [int(n) for n in payload["lengths"]]
    needles = "needles" in payload["lengths"][str(lengths[0])]
    fig, axes = _figure(3 if needles else 2)
    a, b = axes[0], axes[1]
    for n in lengths:
        r = payload["lengths"][str(n)]
        a.plot(r["share"], marker=".", label=f"{n:,} tokens")
    a.set_xlabel("layer")
    a.set_ylabel("attention on the first token (mean over heads, queries)")
    a.set_title("sink strength per layer")
    a.legend()
    kept = [payload["lengths"][str(n)]["loss"] for n in lengths]
    removed = [payload["lengths"][str(n)]["loss_without_sink"] for n in lengths]
    b.plot(lengths, kept, marker="o", label="as it is")
    b.plot(lengths, removed, marker="o", label="first token's attention removed")
    b.set_xscale("log", base=2)
    b.set_xlabel("context length (tokens)")
    b.set_ylabel("next-token loss (nats)")
    b.set_title("the cost of removing the sink: loss")
    b.legend()
    if needles:
        c = axes[2]
        for field, label in (("retrieved", "as it is"), ("retrieved_without_sink", "first token's attention removed")):
            c.plot(lengths, [payload["lengths"][str(n)]["needles"][field] for n in lengths], marker="s", label=label)
        c.set_xscale("log", base=2)
        c.set_ylim(-0.05, 1.05)
        c.set_xlabel("context length (tokens)")
        c.set_ylabel("needles retrieved (share)")
        c.set_title("the cost of removing the sink: needles")
        c.legend()
    _save(fig, path)


register(
    Finding(
        "sink-length",
        "Barbero et al. 2025, Why do LLMs attend to the first token? (arXiv 2504.02732)",
        "the sink grows stronger as the context grows longer, and removing the first-token sink at inference hurts "
        "long-context performance",
        "the first token's attention share per layer (mean over heads and queries) on held-out text at each length, "
        "beside the second token's and what uniform attention would give it; and the next-token loss with the "
        "first token's attention taken from every later query (the rest renormalised), and the share of needle prompts "
        "(a number hidden in the text, asked for at the end) answered with and without it",
        _run_length,
        lambda options: len(options["lengths"]),
        lambda options: options["lengths"],
        _plot_length,
    )
)


# ------------------------------------------------------------------------------------------------- sink-valley
def _run_valley(model, text, options: dict, progress) -> dict:
    out = S.sink_valley(model, text.rows(options["length"]))
    if progress is not None:
        progress.update(1)
    return out


def _plot_layers(ax, runs: dict, field: str, ylabel: str, log: bool = False) -> None:
    for label, r in runs.items():
        if r is not None:
            ax.plot(r[field], marker=".", label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend()


def _plot_valley(payload: dict, path: Path) -> None:
    fig, axes = _figure(3)
    runs = {"as it is": payload["before"], "massive dims ablated": payload.get("after")}
    _plot_layers(axes[0], runs, "norm_ratio", "first token's norm / the others' median", log=True)
    axes[0].set_title("the spike")
    _plot_layers(axes[1], runs, "sink_rate", "share of heads with first-token attention >= 0.3")
    axes[1].set_title("the sink")
    _plot_layers(axes[2], runs, "entropy", "matrix entropy (normalised)")
    axes[2].set_title("the compression valley")
    _save(fig, path)


register(
    Finding(
        "sink-valley",
        "Queipo-de-Llano et al. 2025, Attention Sinks and Compression Valleys in LLMs are Two Sides of the Same Coin "
        "(arXiv 2510.06477)",
        "the first token's hidden norm spikes, the representation's matrix entropy drops and the sink rate goes to "
        "about 1 in the same layers; ablating the massive activation removes both the sink and the valley",
        "per layer on held-out text: the first token's hidden norm over the median of the others', the sink rate "
        "(share of heads putting >= 0.3 of their attention on the first token) and the matrix entropy of the "
        "residual stream; then the dimensions carrying the massive activation, where it first appears, set to the "
        "other tokens' mean there, and all three measured again",
        _run_valley,
        lambda options: 1,
        lambda options: [options["length"]],
        _plot_valley,
    )
)


# ---------------------------------------------------------------------------------------------- massive-origin
def _run_origin(model, text, options: dict, progress) -> dict:
    out = S.massive_origin(
        model, text.rows(options["length"]), k=options["neurons"], spike=options.get("spike", "first")
    )
    if progress is not None:
        progress.update(1)
    return out


def _plot_origin(payload: dict, path: Path) -> None:
    fig, axes = _figure(3)
    runs = {
        "as it is": payload["before"],
        f"top {payload['k']} neurons zeroed": payload.get("zeroed"),
        f"{payload['k']} other neurons zeroed": payload.get("control"),
    }
    _plot_layers(axes[0], runs, "norm_ratio", "first token's norm / the others' median", log=True)
    axes[0].set_title("the massive activation")
    _plot_layers(axes[1], runs, "share", "attention on the first token")
    axes[1].set_title("the sink")
    if payload.get("moved") is not None:
        moved = {"before": payload["unmoved"], "neurons moved there": payload["moved"]}
        _plot_layers(axes[2], moved, "share", f"attention on position {payload['moved_to']}")
        axes[2].set_title("the sink follows the neurons?")
    _save(fig, path)


register(
    Finding(
        "massive-origin",
        "A Single Layer to Explain Them All (arXiv 2605.08504); The Structural Origin of Attention Sink "
        "(arXiv 2605.06611)",
        "massive activations first appear in one layer (its norm and feed-forward) and then ride the residual "
        "stream; a few feed-forward 'super neurons' create the first-token disparity, and editing them moves the sink",
        "the first layer whose output gives the first token a norm 10x the others', the dimensions that carry it, the "
        "feed-forward neurons of that layer writing most toward them (activation x output weight), and the sink "
        "after those neurons are zeroed on the first token (against as many other neurons zeroed) or moved onto a "
        "token in the middle of the text",
        _run_origin,
        lambda options: 1,
        lambda options: [options["length"]],
        _plot_origin,
    )
)


# ---------------------------------------------------------------------------------------------------- fv-heads
def _fv_tasks(text, options: dict) -> dict:
    from ...data.icl_tasks import TASKS
    from . import icl

    out = {}
    for i, name in enumerate(options["tasks"]):
        both = icl.text_prompts(
            TASKS[name], text.encode, n=options["prompts"] + options["held_out"], shots=options["shots"], seed=i
        )
        out[name] = (both[: options["prompts"]], both[options["prompts"] :])
    return out


def _run_fv(model, text, options: dict, progress) -> dict:
    from . import icl

    tasks = _fv_tasks(text, options)
    longest = max(len(p.clean) for scored, held in tasks.values() for p in scored + held)
    if longest > model.config.max_len:
        raise ValueError(
            f"the {options['shots']}-shot prompts run to {longest} tokens, past the model's {model.config.max_len} "
            "positions: pass fewer with --shots"
        )
    vocab = model.config.vocab_size
    return icl.fv_vs_induction(
        model,
        tasks,
        ks=options["ablate"],
        vocab=(min(1000, vocab // 4), vocab),
        seed=options.get("seed", 0),
        progress=progress,
    )


def _plot_fv(payload: dict, path: Path) -> None:
    import numpy as np

    fig, axes = _figure(3)
    fv, ind = np.array(payload["fv"]), np.array(payload["induction"])
    ax = axes[0]
    ax.scatter(ind.flatten(), fv.flatten(), s=10)
    ax.set_xlabel("induction score (prefix matching)")
    ax.set_ylabel("function-vector score (causal indirect effect)")
    ax.set_title("each head, both scores")
    im = axes[1].imshow(fv.T, aspect="auto", cmap="viridis", origin="lower")
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("head")
    axes[1].set_title("function-vector score")
    fig.colorbar(im, ax=axes[1])
    ks = list(payload["ablation"]["k"])
    kinds = ABLATIONS
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        acc = [np.mean(list(payload["ablation"]["k"][k][kind].values())) for k in ks]
        axes[2].bar(np.arange(len(ks)) + j * width, acc, width, label=kind)
    axes[2].axhline(np.mean(list(payload["ablation"]["clean"].values())), color="k", ls="--", label="nothing ablated")
    axes[2].set_xticks(np.arange(len(ks)) + 0.4 - width / 2, [f"top {k}" for k in ks])
    axes[2].set_ylabel("few-shot accuracy (mean over tasks)")
    axes[2].set_title("heads mean-ablated")
    axes[2].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(fig, path)


register(
    Finding(
        "fv-heads",
        "Yin & Steinhardt 2025, Which Attention Heads Matter for In-Context Learning? (arXiv 2502.14010)",
        "function-vector heads, not induction heads, carry few-shot in-context learning; the two sets barely overlap",
        "each head's function-vector score (its mean output at the last position of clean few-shot prompts, patched "
        "into the same prompts with their labels deranged: the rise in the right answer's probability; Todd et al. "
        "2024) over built-in tasks (antonyms, country-capital, present-past, singular-plural, capitalising), its "
        "induction score on repeated random tokens, the overlap of the top heads, and few-shot accuracy on "
        "held-out prompts with the top heads of each kind mean-ablated (beside random heads, and each kind with the "
        "other's top heads left out)",
        _run_fv,
        lambda options: len(options["tasks"]) * options["prompts"] + 1 + len(options["ablate"]) * len(ABLATIONS),
        lambda options: [],
        _plot_fv,
    )
)


# ------------------------------------------------------------------------------------------ hallucination-heads
def _run_hallucination(w, _inputs, options: dict, progress) -> dict:
    from . import hallucination as H

    return H.hallucination_heads(
        w, per_kind=options["clips"], sentences=options["sentences"], top=options["top"], progress=progress
    )


def _plot_hallucination(payload: dict, path: Path) -> None:
    import numpy as np

    fig, axes = _figure(3)
    sites = sorted(
        {r["site"] for r in payload["per_head"]}, key=lambda n: [r["site"] for r in payload["per_head"]].index(n)
    )
    heads = 1 + max(r["head"] for r in payload["per_head"])
    for ax, field, title in (
        (axes[0], "hallucination", "non-speech clips with words"),
        (axes[1], "wer", "word error rate"),
    ):
        grid = np.full((len(sites), heads), np.nan)
        for r in payload["per_head"]:
            grid[sites.index(r["site"]), r["head"]] = r[field]
        im = ax.imshow(grid.T, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1)
        ax.set_xticks(range(len(sites)), [str(i) for i in range(len(sites))])
        ax.set_xlabel("decoder layer (self-attention)")
        ax.set_ylabel("head masked")
        base = payload["selection"]["base"][field]
        ax.set_title(f"{title}, one head masked (none: {base:.2f})")
        fig.colorbar(im, ax=ax)
    groups = list(payload["held_out"])
    x = np.arange(len(groups))
    axes[2].bar(x - 0.2, [payload["held_out"][g]["hallucination"] for g in groups], 0.4, label="non-speech with words")
    axes[2].bar(x + 0.2, [payload["held_out"][g]["wer"] for g in groups], 0.4, label="word error rate (speech)")
    axes[2].set_xticks(x, [f"{g} masked" for g in groups])
    axes[2].set_title("held-out clips and sentences")
    axes[2].set_ylim(0, 1.25)
    axes[2].legend(fontsize=8, loc="upper center", ncol=2)
    _save(fig, path)


register(
    Finding(
        "hallucination-heads",
        "Wang et al. 2025, Calm-Whisper (arXiv 2505.12969)",
        "3 of the 20 decoder self-attention heads of Whisper large-v3 account for most hallucinations on non-speech "
        "audio; masking them cuts hallucination",
        "on non-speech audio made here (white noise at two levels, brown noise, a melody, a chord, mains hum, "
        "silence), the share of clips transcribed with a word, with each decoder self-attention head masked alone "
        "(its output zeroed), against the word error rate it adds on sentences spoken by espeak-ng; the heads with "
        "the largest net effect, chosen on half of the clips, masked together on the other half beside as many "
        "random heads; and every head of one layer masked at once",
        _run_hallucination,
        lambda options: options["heads"] + options["layers"] + 3,
        lambda options: [],
        _plot_hallucination,
        takes="whisper",
    )
)


# ---------------------------------------------------------------------------------------------------- registers
def _run_registers(d, _inputs, options: dict, progress) -> dict:
    from ..media import dino
    from . import registers as R

    inputs = [dino.photo_input(d, name) for name in dino.PHOTOS]
    images, masks = [x for _, x, _ in inputs], [m for _, _, m in inputs]
    out = R.test_time_register(d.model, images, k=options["neurons"], masks=masks)
    if progress is not None:
        progress.update(1)
    return {**out, "photos": list(dino.PHOTOS), "first_photo": next(iter(dino.PHOTOS))}


def _plot_registers(payload: dict, path: Path) -> None:
    import numpy as np

    fig, axes = _figure(4)
    for name, r in payload["runs"].items():
        axes[0].plot(r["max_ratio"], marker=".", label=name)
    axes[0].axhline(4.0, color="k", ls=":", label="outlier threshold")
    axes[0].set_xlabel("block")
    axes[0].set_ylabel("largest patch norm / median (mean over photos)")
    axes[0].set_title("high-norm patches")
    axes[0].legend(fontsize=7)
    names = list(payload["runs"])
    fields = [f for f in ("cls_on_outliers", "cls_on_register", "cls_on_object") if f in payload["runs"][names[0]]]
    width = 0.8 / len(fields)
    for j, f in enumerate(fields):
        axes[1].bar(np.arange(len(names)) + j * width, [payload["runs"][n][f] for n in names], width, label=f)
    axes[1].set_xticks(np.arange(len(names)) + 0.4 - width / 2, [n.replace(", ", "\n") for n in names], fontsize=7)
    axes[1].set_ylabel("last layer's [CLS] attention")
    axes[1].legend(fontsize=7)
    for ax, (name, heat) in zip(axes[2:], payload["first_image_maps"].items()):
        ax.imshow(np.array(heat), cmap="viridis")
        ax.set_title(f"{payload['first_photo']}: {name}", fontsize=9)
        ax.axis("off")
    _save(fig, path)


register(
    Finding(
        "registers",
        "Jiang et al. 2025, Vision Transformers Don't Need Trained Registers (arXiv 2506.08010)",
        "a sparse set of register neurons makes the high-norm outlier tokens of DINOv2 and CLIP; moving their "
        "activation onto one extra, untrained token at test time removes the outliers and cleans the attention maps",
        "on scikit-image's photographs: per block the largest patch norm over the median; the block where it peaks; "
        "the feed-forward neurons (up to that block) most active at the outlier patches; then one extra token of "
        "zeros with those neurons' activations moved onto it (their largest activation over the patches there, "
        "zero elsewhere), beside a bare extra token and random neurons moved: the norms again, and the last layer's "
        "[CLS] attention on the outlier patches, the register and the object",
        _run_registers,
        lambda options: 1,
        lambda options: [],
        _plot_registers,
        takes="dinov2",
    )
)
