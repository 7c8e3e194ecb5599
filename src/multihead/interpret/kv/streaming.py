"""Attention sinks (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks", StreamingLLM):
what a causal LM does on text several times longer than the rows it was trained on, under three caches.

* ``full`` -- every token stays; rotary positions run past the trained length (extrapolation);
* ``window`` -- the last ``window`` tokens only, positions within the cache (a sliding window);
* ``sinks`` -- the first ``sinks`` tokens (4 in the paper) plus the window, positions within the cache.

The text is fed one token at a time through the cache (what a streaming deployment does); every next-token loss is
kept, and perplexity is reported per band of positions. The paper's finding: window-only perplexity jumps once the
first tokens are evicted, because heads park their surplus attention on the first token (the *sink*), and the
window + 4 sinks stays close to the full cache within the trained length and stable beyond it. Also measured: the
share of each head's attention on the first cached slot (the first token for ``full`` and ``sinks``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...modules.capture import capture

POLICIES = ("full", "window", "sinks")


@torch.no_grad()
def stream(model, ids: torch.Tensor, *, policy: str, window: int, sinks: int = 4, progress: bool = False) -> dict:
    """Feed ``ids`` ``(B, N)`` token by token through ``model`` (a rotary CausalLM, native or attached) with the
    ``policy`` cache.
    Returns ``loss`` ``(B, N-1)`` (the loss of predicting token ``t`` from tokens ``< t``) and ``first_share``
    ``(N-1, layers, H)`` (mean over the batch of the attention weight on the first cached slot at each step)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {POLICIES}")
    if policy == "full":  # every key, positions running on past the trained length
        cache = model.new_cache(extrapolate=True)
    else:
        cache = model.new_cache(window=window, sinks=sinks if policy == "sinks" else 0)
    was = model.training
    model.eval()
    losses, shares = [], []
    from tqdm import tqdm

    with capture(model, ("pattern",)) as cap:
        logits = model(ids[:, :1], cache=cache)[:, -1]
        for t in tqdm(range(1, ids.shape[1]), desc=f"{policy} cache", leave=False, disable=not progress):
            losses.append(F.cross_entropy(logits.float(), ids[:, t], reduction="none"))
            logits = model(ids[:, t : t + 1], cache=cache)[:, -1]
            shares.append(torch.stack([p[:, :, -1, 0].float().mean(0) for p in cap.patterns()]))  # (layers, H)
    model.train(was)
    return {"loss": torch.stack(losses, 1), "first_share": torch.stack(shares)}


def compare(
    model, ids: torch.Tensor, *, window: int, sinks: int = 4, band: int | None = None, progress: bool = False
) -> dict:
    """The three policies on the same text: perplexity per band of ``band`` positions (default: the window),
    overall, and the first token's share of attention per layer and head (averaged over the steps after the
    first ``window`` tokens, where the policies differ)."""
    band = band or window
    out = {
        "window": window,
        "sinks": sinks,
        "band": band,
        "length": ids.shape[1],
        "batch": ids.shape[0],
        "trained_length": model.config.max_len,
        "policies": {},
    }
    for policy in POLICIES:
        r = stream(model, ids, policy=policy, window=window, sinks=sinks, progress=progress)
        loss = r["loss"]  # (B, N-1): predicting positions 1..N-1
        bands = []
        for start in range(0, loss.shape[1], band):
            chunk = loss[:, start : start + band]
            bands.append(
                {
                    "from": start + 1,
                    "to": start + chunk.shape[1],
                    "perplexity": math.exp(min(float(chunk.mean()), 50.0)),
                }
            )
        late = r["first_share"][window:] if r["first_share"].shape[0] > window else r["first_share"]
        out["policies"][policy] = {
            "perplexity": math.exp(min(float(loss.mean()), 50.0)),
            "bands": bands,
            "first_share": late.mean(0).tolist(),
        }
    return out


def format_table(result: dict) -> str:
    bands = result["policies"]["full"]["bands"]
    head = f"{'cache':<26}" + "".join(f"{b['from']:>5}-{b['to']:<5}" for b in bands) + f"{'all':>8}"
    lines = [
        f"perplexity by position band; trained on rows of {result['trained_length']} tokens, text of "
        f"{result['length']} tokens x {result['batch']}, window {result['window']}, sinks {result['sinks']}",
        head,
    ]
    names = {
        "full": "full cache",
        "window": f"window {result['window']}",
        "sinks": f"window {result['window']} + {result['sinks']} sinks",
    }
    for policy, r in result["policies"].items():
        lines.append(
            f"{names[policy]:<26}"
            + "".join(f"{b['perplexity']:>11.1f}" for b in r["bands"])
            + f"{r['perplexity']:>8.1f}"
        )
    lines.append(
        "first cached slot's share of attention (mean over heads, per layer, after the window fills): "
        + "; ".join(
            f"{p} " + " ".join(f"{sum(row) / len(row):.2f}" for row in r["first_share"])
            for p, r in result["policies"].items()
        )
    )
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    from ...plotting import save as save_figure
    from ...plotting import pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, r in result["policies"].items():
        mids = [(x["from"] + x["to"]) / 2 for x in r["bands"]]
        label = {
            "full": "full cache",
            "window": f"window {result['window']}",
            "sinks": f"window {result['window']} + {result['sinks']} sinks",
        }.get(policy, policy)
        a.plot(mids, [x["perplexity"] for x in r["bands"]], marker="o", label=label)
    if result["trained_length"] < result["length"]:  # only where the text runs past it
        a.axvline(result["trained_length"], color="grey", ls=":", label="trained length")
    a.set_title(f"perplexity per band of {result['band']} positions")
    a.set_xlabel("position in the text")
    a.set_ylabel("perplexity (band)")
    a.set_yscale("log")
    a.legend()
    shares = result["policies"]["full"]["first_share"]
    im = b.imshow(shares, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    b.set_xlabel("head")
    b.set_ylabel("layer")
    b.set_title("attention on the first token (full cache)")
    fig.colorbar(im, ax=b)
    for ax in (a,):
        ax.grid(alpha=0.3)
    if result.get("model"):
        fig.suptitle(
            f"{result['model']}: streaming with three KV caches, {result['batch']} text(s) of {result['length']} tokens"
        )
    fig.tight_layout()
    save_figure(fig, path, formats=("png",), dpi=110)
    plt.close(fig)


def report(result: dict, out, *, overwrite: bool = False, sources: tuple = ()) -> None:
    """Print the table and, with ``out``, write ``sinks.json`` and ``sinks.png`` there (built aside, swapped in)."""
    from pathlib import Path

    from ..._io import Publish, atomic_write_json

    print(format_table(result))
    if out:
        with Publish(out, "sinks", overwrite=overwrite, sources=sources) as folder:
            atomic_write_json(folder / "sinks.json", result)
            plot(result, folder / "sinks.png")
        print(f"wrote {Path(out) / 'sinks.json'} and sinks.png")


__all__ = ["POLICIES", "compare", "format_table", "plot", "report", "stream"]
