"""Induction heads (Olsson et al. 2022, "In-context Learning and Induction Heads"; Elhage et al. 2021).

An induction head completes ``[A][B] ... [A] -> [B]``: at the second ``[A]`` it attends to the token that *followed*
the earlier ``[A]`` (prefix matching) and raises that token's logit (copying). Both are measured per head of a
causal model (:class:`~multihead.models.CausalLM`), with the rules stated here:

* **Prefix-matching score** -- on sequences ``s r_1 .. r_n r_1 .. r_n`` (a start token, then ``n`` random tokens
  repeated once), the mean attention weight that a query at the second occurrence of ``r_i`` (``i >= 2``... every
  repeated token whose predecessor also repeated) puts on the key right after the first occurrence of ``r_i``. 1.0
  is a perfect induction pattern; a head that spreads evenly over its past scores about ``1 / position``.
* **Copying score** -- of the head's OV circuit ``W_U W_O^h W_V^h W_E`` (``V x V``, LayerNorms left out as in the
  paper): ``sum(Re lambda) / sum(|lambda|)`` over its eigenvalues ``lambda``, computed on the ``d_head x d_head``
  matrix ``W_V^h W_E^T W_U W_O^h`` that has the same non-zero eigenvalues. 1 = attending to a token raises that
  token's logit; -1 = lowers it.
* **Role rule** (``multihead heads`` on a causal LM): a head is an ``induction`` head when its prefix-matching score
  is >= :data:`INDUCTION` (0.4, i.e. well over the ~1/n of a uniform head and the 0 of a previous-token head).

The toy experiment (:func:`train_toy`): a 2-layer attention-only model trained on repeated random tokens (the repeat
length varies per batch, so that no positional shortcut solves the task; see :class:`ToyConfig`); the loss on
the repeated half falls far below the first half's (which no model can predict) once an induction head forms -- the
phase change -- and the step where that happens is reported with both curves.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...modules.capture import attention_modules, capture

INDUCTION = 0.4


def repeated_tokens(batch: int, half: int, *, low: int, high: int, start: int, generator: torch.Generator) -> Tensor:
    """``(batch, 1 + 2 * half)``: ``start``, then ``half`` tokens uniform in ``[low, high)``, repeated once."""
    if half < 2 or high - low < 2:
        raise ValueError(f"need half >= 2 and at least two token ids to draw from, got half={half}, [{low}, {high})")
    r = torch.randint(low, high, (batch, half), generator=generator)
    return torch.cat([torch.full((batch, 1), start, dtype=torch.long), r, r], 1)


def prefix_matching(patterns: list[Tensor], half: int) -> Tensor:
    """``(layers, H)`` prefix-matching scores from per-layer weights ``(B, H, L, L)`` of :func:`repeated_tokens`
    sequences (``L = 1 + 2 * half``): the query at position ``1 + half + i`` (second occurrence of ``r_i``, ``i >= 1``
    counted from 0) looks for key ``2 + i`` (the token after the first ``r_i``)."""
    q = torch.arange(1 + half, 1 + 2 * half - 1)  # second occurrences, but the last (nothing follows to predict)
    k = q - half + 1  # the token that followed the first occurrence
    return torch.stack([p[:, :, q, k].float().mean((0, 2)) for p in patterns])


def induction_scores(model, *, half: int = 32, batch: int = 16, low: int = 0, start: int = 0, seed: int = 0) -> dict:
    """Prefix-matching ``(layers, H)``, copying ``(layers, H)`` and the per-token loss on each half for ``model``
    (a CausalLM), on seeded repeated random tokens drawn from ``[low, vocab_size)``."""
    g = torch.Generator().manual_seed(seed)
    ids = repeated_tokens(batch, half, low=low, high=model.config.vocab_size, start=start, generator=g)
    was = model.training
    model.eval()
    with torch.no_grad(), capture(model, ("pattern",)) as cache:
        logits = model(ids)
    model.train(was)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none").view(batch, -1)
    return {
        "prefix_matching": prefix_matching(cache.patterns(), half),
        "copying": copying_scores(model),
        "loss_first_half": float(loss[:, :half].mean()),
        "loss_second_half": float(loss[:, half + 1 :].mean()),
        "half": half,
    }


@torch.no_grad()
def copying_scores(model) -> Tensor:
    """``(layers, H)`` copying scores of a CausalLM's self-attention heads (see the module docstring)."""
    w_e = model.embed.weight.float()  # (V, E)
    w_u = model.lm_head.weight.float()  # (V, E)
    rows = []
    for _, attn in attention_modules(model):
        h, dh = attn.num_heads, attn.head_dim
        group = h // attn.num_kv_heads
        if getattr(attn, "w_v", None) is None:  # an attached HF layer with fused q, k, v: not split here
            rows.append(torch.full((h,), float("nan")))
            continue
        w_v = attn.w_v.weight.float()  # (Hkv * dh, E)
        w_o = attn.w_o.weight.float()  # (E, H * dh)
        mid = w_e.T @ w_u  # (E, E): embed -> unembed through the residual stream
        scores = []
        for i in range(h):
            j = i // group  # the key/value head this query head reads
            a = w_v[j * dh : (j + 1) * dh] @ mid @ w_o[:, i * dh : (i + 1) * dh]  # (dh, dh)
            lam = torch.linalg.eigvals(a.double())
            scores.append(float(lam.real.sum() / lam.abs().sum().clamp_min(1e-30)))
        rows.append(torch.tensor(scores))
    return torch.stack(rows)


# ---------------------------------------------------------------------------------------------------- the toy run
@dataclass
class ToyConfig:
    vocab: int = 256  # small vocabularies repeat tokens inside a half, which blurs "the previous occurrence"
    half: int = 24  # random tokens before the repeat (the longest; see vary_half)
    # Draw each batch's repeat length from [half // 2, half]. With one fixed length and learned positions, a
    # layer-0 head solves the task by position alone ("attend to p - half + 1"), scores ~0.95 prefix matching and is
    # no induction head (measured: vocab 256, fixed half 24); a varying length leaves only the induction mechanism.
    vary_half: bool = True
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    steps: int = 3000  # the phase change comes at ~1,200 steps; the best head passes 0.8 by ~3,000
    batch_size: int = 32
    lr: float = 1e-3
    eval_every: int = 25
    seed: int = 0

    def __post_init__(self) -> None:
        from ..._config import check_rules

        check_rules(
            [
                ("vocab", self.vocab >= 2, ">= 2"),
                ("half", self.half >= 2, ">= 2"),
                (
                    "d_model",
                    self.d_model >= 1 and self.d_model % max(self.num_heads, 1) == 0,
                    "a positive multiple of num_heads",
                ),
                ("num_heads", self.num_heads >= 1, ">= 1"),
                ("num_layers", self.num_layers >= 1, ">= 1"),
                ("steps", self.steps >= 1, ">= 1"),
                ("batch_size", self.batch_size >= 1, ">= 1"),
                ("lr", self.lr > 0, "> 0"),
                ("eval_every", self.eval_every >= 1, ">= 1"),
            ]
        )


def train_toy(config: ToyConfig | None = None, *, progress: bool = False) -> dict:
    """Train a 2-layer attention-only CausalLM on repeated random tokens; every ``eval_every`` steps record the loss
    on each half and every head's prefix-matching score (fixed evaluation sequences). Returns the history, the
    phase-change step (the first evaluation at which the second half's loss is below half the first half's) and the
    final scores."""
    from tqdm import tqdm

    from ...models.seq2seq import CausalLM, CausalLMConfig
    from ...modules.decoder import DecoderConfig

    config = config or ToyConfig()
    torch.manual_seed(config.seed)
    model = CausalLM(
        CausalLMConfig(
            vocab_size=config.vocab + 1,
            max_len=1 + 2 * config.half,
            positional="learned",
            decoder=DecoderConfig(
                d_model=config.d_model,
                num_heads=config.num_heads,
                num_layers=config.num_layers,
                d_ff=0,
                dropout=0.0,
                norm_first=True,
                cross_attention=False,
            ),
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(config.seed + 1)
    start = config.vocab  # a token of its own marks the start
    history = []
    for step in tqdm(range(config.steps + 1), desc="induction toy", disable=not progress):
        if step % config.eval_every == 0:
            s = induction_scores(model, half=config.half, batch=64, low=0, start=start, seed=12345)
            history.append(
                {
                    "step": step,
                    "loss_first_half": s["loss_first_half"],
                    "loss_second_half": s["loss_second_half"],
                    "prefix_matching": s["prefix_matching"].tolist(),
                }
            )
        if step == config.steps:
            break
        half = config.half
        if config.vary_half:
            half = int(torch.randint(max(2, config.half // 2), config.half + 1, (1,), generator=g))
        ids = repeated_tokens(config.batch_size, half, low=0, high=config.vocab, start=start, generator=g)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    final = induction_scores(model, half=config.half, batch=64, low=0, start=start, seed=12345)
    phase = next((h["step"] for h in history if h["loss_second_half"] < 0.5 * h["loss_first_half"]), None)
    return {
        "config": asdict(config),
        "history": history,
        "phase_change_step": phase,
        "prefix_matching": final["prefix_matching"].tolist(),
        "copying": final["copying"].tolist(),
        "loss_first_half": final["loss_first_half"],
        "loss_second_half": final["loss_second_half"],
        "uniform_loss": math.log(config.vocab),
        "model": model,
    }


def plot_toy(result: dict, path) -> None:
    """Loss on each half and the best prefix-matching score per layer, over training steps."""
    from ...plotting import save as save_figure
    from ...plotting import pyplot

    plt = pyplot()
    hist = result["history"]
    steps = [h["step"] for h in hist]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(steps, [h["loss_first_half"] for h in hist], label="first half (random: unpredictable)")
    a.plot(steps, [h["loss_second_half"] for h in hist], label="repeated half")
    a.axhline(result["uniform_loss"], color="grey", ls=":", label="log(vocab)")
    if result["phase_change_step"] is not None:
        for ax in (a, b):
            ax.axvline(result["phase_change_step"], color="red", ls="--", alpha=0.5)
    a.set_xlabel("step")
    a.set_ylabel("loss (nats per token)")
    a.legend()
    layers = len(hist[0]["prefix_matching"])
    for l in range(layers):
        b.plot(steps, [max(h["prefix_matching"][l]) for h in hist], label=f"layer {l}: best head")
    b.axhline(INDUCTION, color="grey", ls=":", label=f"induction rule ({INDUCTION})")
    b.set_xlabel("step")
    b.set_ylabel("prefix-matching score")
    b.set_ylim(0, 1)
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle("Induction heads form: 2-layer attention-only model on repeated random tokens")
    fig.tight_layout()
    save_figure(fig, path, formats=("png",), dpi=110)
    plt.close(fig)


@torch.no_grad()
def ablation(
    model,
    prefix: Tensor,
    *,
    k: int = 10,
    half: int = 32,
    batch: int = 16,
    low: int = 0,
    start: int = 0,
    seed: int = 1,
    draws: int = 5,
) -> dict:
    """The causal check of Olsson et al.: the loss on the repeated half of fresh repeated-token sequences with the
    ``k`` heads of highest prefix-matching score masked (``head_mask``), against ``k`` random heads masked (the
    mean over ``draws`` seeded draws) and nothing masked."""
    layers, heads = prefix.shape
    g = torch.Generator().manual_seed(seed)
    ids = repeated_tokens(batch, half, low=low, high=model.config.vocab_size, start=start, generator=g)

    def loss(mask) -> float:
        logits = model(ids, head_mask=mask)
        per = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
        return float(per.view(batch, -1)[:, half + 1 :].mean())

    def mask_of(flat) -> Tensor:
        m = torch.ones(layers * heads)
        m[flat] = 0
        return m.view(layers, heads)

    top = prefix.flatten().argsort(descending=True)[:k]
    random = [loss(mask_of(torch.randperm(layers * heads, generator=g)[:k])) for _ in range(draws)]
    return {
        "k": k,
        "base": loss(None),
        "top": loss(mask_of(top)),
        "random": random,
        "random_mean": sum(random) / len(random),
        "top_heads": [[int(i) // heads, int(i) % heads] for i in top],
    }


def plot_scores(result: dict, path, title: str) -> None:
    """Prefix-matching (left) and copying (right) score of every head, layers x heads, with colorbars."""
    from ...plotting import save as save_figure
    from ...plotting import pyplot

    plt = pyplot()
    from ...plotting import SIGNED

    pm, cp = result["prefix_matching"], result["copying"]
    span = max((abs(float(v)) for row in cp for v in row), default=1.0) or 1.0  # copying scores are often small
    fig, axes = plt.subplots(1, 2, figsize=(10, max(4, 0.22 * len(pm) + 1.5)))
    for ax, data, name, cmap, lim in (
        (axes[0], pm, "prefix-matching score", "viridis", (0, 1)),
        (axes[1], cp, f"copying score (OV eigenvalues; scale +-{span:.2f})", SIGNED, (-span, span)),
    ):
        im = ax.imshow(data, aspect="auto", cmap=cmap, vmin=lim[0], vmax=lim[1])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(len(data[0])))
        ax.set_yticks(range(len(data)), [str(l) for l in range(len(data))], fontsize=6 if len(data) > 12 else 9)
        ax.set_title(name, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046)
    for entry in result.get("induction_heads", []):
        for ax in axes:
            ax.add_patch(plt.Rectangle((entry["head"] - 0.5, entry["layer"] - 0.5), 1, 1, fill=False, ec="red"))
    fig.suptitle(title + f" (red: >= {INDUCTION})")
    fig.tight_layout()
    save_figure(fig, path, formats=("png",), dpi=110)
    plt.close(fig)


def format_scores(scores: dict) -> str:
    """A layers x heads table of prefix-matching / copying scores, induction heads starred."""
    pm, cp = scores["prefix_matching"], scores["copying"]
    heads = len(pm[0])
    lines = [
        f"prefix-matching / copying score per head (repeated random tokens, half = {scores['half']}); "
        f"* = induction (prefix matching >= {INDUCTION})",
        "layer " + "".join(f"{'head ' + str(h):>14}" for h in range(heads)),
    ]
    for l, (row_p, row_c) in enumerate(zip(pm, cp)):
        cells = [f"{float(p):.2f}/{float(c):+.2f}{'*' if float(p) >= INDUCTION else ' '}" for p, c in zip(row_p, row_c)]
        lines.append(f"{l:>5} " + "".join(f"{c:>14}" for c in cells))
    lines.append(
        f"loss per token on these sequences: first half {scores['loss_first_half']:.3f} (random tokens), repeated "
        f"half {scores['loss_second_half']:.3f}"
    )
    return "\n".join(lines)


def induction_roles(prefix: Tensor) -> list[list[str]]:
    """``roles[layer][head]``: ``induction`` where the prefix-matching score is >= :data:`INDUCTION`, else ``-``."""
    return [["induction" if float(v) >= INDUCTION else "-" for v in row] for row in prefix]


__all__ = [
    "mark_induction",
    "INDUCTION",
    "ToyConfig",
    "ablation",
    "copying_scores",
    "plot_scores",
    "format_scores",
    "induction_roles",
    "induction_scores",
    "plot_toy",
    "prefix_matching",
    "repeated_tokens",
    "train_toy",
]


def mark_induction(result: dict, prefix_matching: Tensor) -> dict:
    """Add each head's prefix-matching score ``(layers, H)`` to a roles ``result`` and make the heads at or above
    :data:`INDUCTION` induction heads; the role counts are recounted."""
    from .scores import ROLES

    for h in result["heads"]:
        h["prefix_matching"] = round(float(prefix_matching[h["layer"], h["head"]]), 4)
        if h["prefix_matching"] >= INDUCTION:
            h["role"] = "induction"
    result["counts"] = {r: sum(1 for x in result["heads"] if x["role"] == r) for r in ROLES}
    return result
