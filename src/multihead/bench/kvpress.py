"""``multihead bench kv``: multihead's KV policies beside NVIDIA's kvpress presses, on the same HF folder.

The incumbent for KV-cache compression on HF models is kvpress (0.5.5: it needs transformers >= 4.56, < 5.3, so it
runs from ``make kvpress``'s environment, with transformers 4.57.6). Both sides read the same folder (default:
SmolLM2-135M exported to an HF folder, the bench writes it once into ``$XDG_CACHE_HOME/multihead``), the same
needle prompts (a number hidden in held-out reviews, then the question: :mod:`multihead.data.needles`) and the same
perplexity text, at matched kept fractions of the prompt's keys (1/8, 1/4, 1/2 by default):

* **ours** -- the folder read with transformers and attached; each policy of
  :data:`~multihead.modules.kv.KV_POLICIES` at ``budget = fraction x prompt`` keys per key/value head,
  through HF's cache API (:class:`multihead.hf.PolicyCache`). The head-aware mix keeps every key for the data-free
  split's top ``fraction / 2`` of key/value heads and a window for the others, sized so that its bytes match;
* **kvpress** -- the folder read by HF (SDPA; eager for the presses that read attention weights), each press at
  ``compression_ratio = 1 - fraction``, applied while the prompt is read (``with press(model)``), as kvpress does.

Per row: needles answered exactly, the answer's token accuracy, perplexity of ``--tokens`` tokens after
``--context`` tokens (kvpress compresses the context; afterwards its cache grows, ours keeps evicting), the bytes
the cache's tensors hold after the prompt (kvpress's AdaKV masks keys and keeps them: its tensors are whole),
the process's resident memory after the prompt and the most the row added at its peak (over what the process held
when it began, with earlier rows' freed memory handed back), prefill seconds and decode tokens per second.
``keys`` > 1 puts several needles in each prompt, one asked for (multi-key retrieval). The JSON is written
after every row, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

FRACTIONS = (0.125, 0.25, 0.5)
# each kvpress press (as built from its compression ratio) and the multihead policy it is paired with
PRESSES = {
    "StreamingLLMPress": "window",
    "SnapKVPress": "snapkv",
    "ObservedAttentionPress": "h2o",
    "TOVAPress": "tova",
    "KnormPress": "knorm",
    "PyramidKVPress": "pyramidkv",
    "ExpectedAttentionPress": "expected",
    "AdaKVPress(SnapKVPress)": "adakv",
    "CriticalKVPress(SnapKVPress)": None,
}
EAGER = ("ObservedAttentionPress",)  # presses that read the attention weights: HF's eager attention
INSTALL = "make kvpress (then run .venv-kvpress/bin/multihead bench kv)"


def default_out() -> Path:
    return Path("bench/results") / f"kv-{time.strftime('%Y%m%d-%H%M%S')}.json"


def _rss_mib() -> float:
    """The process's resident memory now (MiB), from /proc (0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _row_start() -> float | None:
    """Before a row: the memory freed by earlier rows handed back (garbage collected, glibc's free lists trimmed),
    the kernel's peak resident mark reset; the resident MiB now (None where the peak cannot be reset)."""
    import ctypes
    import gc

    from .harness import _reset_peak

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return _rss_mib() if _reset_peak() else None


def _peak_added(start: float | None) -> float | None:
    """After a row: the most resident memory it held over what the process held at its start (MiB)."""
    from .._proc import status_kib

    return None if start is None else round(max(0.0, status_kib("VmHWM") / 1024 - start), 1)


def smollm2_folder() -> Path:
    """SmolLM2-135M as an HF folder (``multihead export smollm2``), written once outside the repository."""
    from .._io import cache_home
    from ..loading import load
    from ..pretrained.causal_lm import export

    folder = cache_home() / "smollm2-hf"
    if not (folder / "config.json").is_file():
        p = load("smollm2").detail
        export(p.model, folder, pretrained=p, overwrite=True)
    return folder


# ------------------------------------------------------------------------------------------------ the two sides
class Ours:
    """The folder read with transformers and attached; each policy through :class:`multihead.hf.PolicyCache`."""

    side = "multihead"

    def __init__(self, folder: Path, ranking: list[list[float]] | None = None):
        from ..interpret.kv.heads import kv_heads_per_layer
        from ..loading import load

        self.lm = load(f"hf:{folder}").detail
        self.model = self.lm.model  # AttachedLM
        self._split: dict = {}
        self.ranking = ranking  # each key/value head's score (a kv-heads.json's), or None: the data-free one
        if ranking is not None and [len(r) for r in ranking] != kv_heads_per_layer(self.model):
            raise ValueError(
                f"the kv-heads.json names {[len(r) for r in ranking]} key/value heads per layer; {folder} has "
                f"{kv_heads_per_layer(self.model)}: classify this model's heads (multihead heads MODEL --kv)"
            )

    def names(self) -> list[str]:
        from ..modules.kv import KV_POLICIES

        return [n for n, cls in KV_POLICIES.items() if n != "full" and not cls.why_not("attached")]

    def _policy(self, name: str, fraction: float, length: int):
        from ..modules.kv import KV_POLICIES, head_aware_at, make_policy

        if name == "full":
            return make_policy("full")
        if not KV_POLICIES[name].needs_split:
            return make_policy(name, max(1, round(fraction * length)))
        heads = self.split(fraction / 2)  # about half the bytes to the heads that keep every key
        return head_aware_at(fraction, length, heads, [len(g) for g in self._kv_heads()])

    def _kv_heads(self) -> list[range]:
        from ..interpret.kv.heads import kv_heads_per_layer

        return [range(g) for g in kv_heads_per_layer(self.model)]

    def split(self, share: float) -> list[list[int]]:
        """The split keeping ``share`` of the key/value heads: by the given ranking (a kv-heads.json's), else the
        data-free one (echo and induction scores)."""
        if share not in self._split:
            from ..interpret.kv.heads import echo_and_induction, kv_head_scores, kv_heads_per_layer, split

            scores = self.ranking
            if scores is None:
                ei = echo_and_induction(self.model, half=32, batch=4, start=self.lm.bos_id or 0)
                scores = kv_head_scores(torch.maximum(ei["echo"], ei["induction"]), kv_heads_per_layer(self.model))
            self._split[share] = split(scores, share)
        return self._split[share]

    @torch.no_grad()
    def prefill(self, name: str, fraction: float, ids: torch.Tensor):
        cache = self.model.new_cache(policy=self._policy(name, fraction, ids.shape[1]))
        t0 = time.perf_counter()
        logits = self.model(ids, cache=cache)[:, -1]
        seconds = time.perf_counter() - t0
        return logits, cache, seconds, cache.kv_nbytes()

    @torch.no_grad()
    def step(self, token: torch.Tensor, cache) -> torch.Tensor:
        return self.model.step(token, cache)


class KVPress:
    """kvpress's presses on HF's own model from the same folder; a press compresses while the prompt is read."""

    side = "kvpress"

    def __init__(self, folder: Path):
        import kvpress  # noqa: F401  (a missing package is named by the caller)
        from transformers import AutoModelForCausalLM

        self.folder = folder
        self.models = {
            impl: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=impl).eval()
            for impl in ("sdpa", "eager")
        }

    def names(self) -> list[str]:
        return list(PRESSES)

    def press(self, name: str, fraction: float):
        return make_press(name, fraction)

    @torch.no_grad()
    def prefill(self, name: str, fraction: float, ids: torch.Tensor):
        from contextlib import nullcontext

        from transformers import DynamicCache

        model = self.models["eager" if name in EAGER else "sdpa"]
        cache = DynamicCache()
        press = nullcontext() if name == "full" else self.press(name, fraction)(model)
        t0 = time.perf_counter()
        with press:
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
        seconds = time.perf_counter() - t0
        self._model, self._position = model, ids.shape[1]
        return logits, cache, seconds, _tensor_bytes(cache)

    @torch.no_grad()
    def step(self, token: torch.Tensor, cache) -> torch.Tensor:
        """One token at its true position: a compressed cache is shorter than the text read, so HF's default
        (the cache's length) would give it the wrong rotary position; kvpress's own pipeline passes it too."""
        position = torch.tensor([[self._position]])
        self._position += 1
        out = self._model(input_ids=token[:, None], past_key_values=cache, position_ids=position, use_cache=True)
        return out.logits[:, -1]


def make_press(name: str, fraction: float):
    """kvpress's press ``name`` keeping ``fraction`` of the keys (``compression_ratio = 1 - fraction``);
    ``Outer(Inner)`` wraps one press in another (AdaKV, CriticalKV)."""
    import kvpress

    ratio = 1 - fraction
    if "(" in name:
        outer, inner = name.rstrip(")").split("(")
        return getattr(kvpress, outer)(press=getattr(kvpress, inner)(compression_ratio=ratio))
    return getattr(kvpress, name)(compression_ratio=ratio)


def _tensor_bytes(cache) -> int:
    """Bytes of every key and value tensor an HF cache holds (masked entries count: they are held)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


# ------------------------------------------------------------------------------------------------ measuring
def _check_methods(methods) -> None:
    """Refuse a method neither side knows (multihead's policies that serve HF models, kvpress's presses)."""
    from ..modules.kv import KV_POLICIES

    known = {"full", *PRESSES} | {n for n, cls in KV_POLICIES.items() if not cls.why_not("attached")}
    unknown = sorted(set(methods or ()) - known)
    if unknown:
        raise ValueError(f"bench kv knows no method {', '.join(unknown)}; choose from {', '.join(sorted(known))}")


def _needles(side, name: str, fraction: float, needles) -> dict:
    exact = right = total = 0
    seconds, kept, rss = [], [], []
    for n in needles:
        ids = torch.tensor([n.ids])
        logits, cache, s, b = side.prefill(name, fraction, ids)
        seconds.append(s)
        kept.append(b)
        rss.append(_rss_mib())
        got = []
        for i in range(len(n.answer)):
            nxt = logits.argmax(-1)
            got.append(int(nxt))
            if i < len(n.answer) - 1:
                logits = side.step(nxt, cache)
        hits = sum(int(a == b) for a, b in zip(got, n.answer))
        exact += int(hits == len(n.answer))
        right += hits
        total += len(n.answer)
    return {
        "needles_exact": exact,
        "needles": len(needles),
        "token_accuracy": round(right / total, 4),
        "prefill_seconds": round(sum(seconds) / len(seconds), 3),
        "kv_bytes": round(sum(kept) / len(kept)),
        "rss_mib": round(max(rss), 1),
    }


def _perplexity(side, name: str, fraction: float, ids: torch.Tensor, context: int) -> dict:
    logits, cache, _, after = side.prefill(name, fraction, ids[:, :context])
    losses = []
    t0 = time.perf_counter()
    for t in range(context, ids.shape[1]):
        losses.append(float(F.cross_entropy(logits.float(), ids[:, t])))
        if t < ids.shape[1] - 1:
            logits = side.step(ids[:, t], cache)
    seconds = time.perf_counter() - t0
    return {
        "perplexity": round(math.exp(sum(losses) / len(losses)), 4),
        "decode_tokens_per_s": round((len(losses) - 1) / seconds, 2),
        "kv_bytes_after_context": after,
    }


def run(
    *,
    folder: Path | None = None,
    fractions=FRACTIONS,
    length: int = 2048,
    needles: int = 3,
    context: int = 1024,
    tokens: int = 128,
    keys: int = 1,
    methods=None,
    ranking: list[list[float]] | None = None,
    out: Path | None = None,
    progress: bool = True,
) -> dict:
    """Every method of both sides at every fraction (``methods``: only those named, policies or presses), on
    ``needles`` prompts of ``length`` tokens with ``keys`` needles each, and the perplexity of ``tokens`` tokens
    after ``context``; written to ``out`` after every row."""
    from tqdm import tqdm

    from ..data.lm_text import held_out_rows
    from ..interpret.kv.heads import needles_for
    from .harness import machine_info, write_json

    _check_methods(methods)  # before any model is read
    folder = folder or smollm2_folder()
    ours = Ours(folder, ranking)
    sides: list = [ours]
    missing = None
    try:
        sides.append(KVPress(folder))
    except ImportError:
        missing = f"kvpress is not installed here: {INSTALL}"
    prompts = needles_for(ours.lm, length=length, count=needles, seed=1, keys=keys)
    text = held_out_rows(ours.lm, rows=1, length=context + tokens, skip=1)
    rows_to_run = [(side, "full", 1.0) for side in sides] + [
        (side, name, f) for f in fractions for side in sides for name in side.names() if not methods or name in methods
    ]
    payload = {
        "suite": "kv",
        "config": {
            "model": str(folder),
            "needle_length": length,
            "needles": needles,
            "keys": keys,
            "head_split": "data-free" if ranking is None else "given (--kv-heads)",
            "context": context,
            "tokens": tokens,
            "fractions": list(fractions),
            "pairs": PRESSES,
            "kvpress": missing or "0.5.5",
        },
        "machine": machine_info(None),
        "results": [],
    }
    whole: dict[str, int] = {}  # each side's full cache after a needle prompt: the kept shares' denominator
    for side, name, fraction in tqdm(rows_to_run, desc="bench kv", disable=not progress):
        row = {"side": side.side, "method": name, "fraction": fraction}
        start = _row_start()
        try:
            row.update(_needles(side, name, fraction, prompts))
            whole.setdefault(side.side, row["kv_bytes"])
            row["kept_share"] = round(row["kv_bytes"] / whole[side.side], 4)
            row.update(_perplexity(side, name, fraction, text, context))
        except Exception as exc:  # noqa: BLE001  a method that fails is recorded, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["rss_peak_added_mib"] = _peak_added(start)
        payload["results"].append(row)
        if out is not None:
            write_json(out, payload)  # what is measured so far, after every row
    return payload


def from_args(args, out: Path) -> dict:
    folder = Path(args.model) if getattr(args, "model", None) else None
    if folder is not None and not (folder / "config.json").is_file():
        raise ValueError(f"bench kv takes an HF causal-LM folder (config.json + safetensors); {folder} is not one")
    from ..data.needles import CITIES

    keys = getattr(args, "keys", 1) or 1
    if not 1 <= keys <= len(CITIES):
        raise ValueError(f"--keys is the number of needles in one prompt, in [1, {len(CITIES)}], got {keys}")
    _check_methods(getattr(args, "impls", None))
    ranking = None
    if getattr(args, "kv_heads", None):
        from .._io import read_json_file
        from ..interpret.kv.heads import ranking as rank, read_split

        read_split(args.kv_heads)  # a kv-heads.json, checked
        path = Path(args.kv_heads)
        ranking = rank(read_json_file(path / "kv-heads.json" if path.is_dir() else path))
    lengths = getattr(args, "lengths", None) or [2048]
    context = getattr(args, "context", None) or 1024
    payload = run(
        folder=folder,
        length=lengths[0],
        context=context,
        keys=keys,
        fractions=tuple(getattr(args, "fractions", None) or FRACTIONS),
        methods=getattr(args, "impls", None),
        ranking=ranking,
        out=out,
    )
    plot(payload, out.with_suffix(""))
    return payload


def plot(payload: dict, stem: str | Path) -> list[Path]:
    """Needles answered and perplexity against the share of the full cache's bytes held, one line per method
    (multihead's solid with circles, kvpress's dashed with squares; a policy and the press paired with it share a
    colour), PNG and SVG."""
    from ..plotting import plain, pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    rows = [r for r in payload["results"] if "error" not in r and r["method"] != "full"]
    methods = list(dict.fromkeys((r["side"], r["method"]) for r in rows))
    cmap = plt.get_cmap("tab20")
    pair = {m: i for i, m in enumerate(dict.fromkeys(PRESSES.get(m) or m for _, m in methods))}  # a pair, a colour
    for side, method in methods:
        pts = sorted(
            ((r["kept_share"], r) for r in rows if (r["side"], r["method"]) == (side, method)), key=lambda t: t[0]
        )
        x = [p for p, _ in pts]
        style = dict(color=cmap(pair[PRESSES.get(method) or method] % 20), marker="o" if side == "multihead" else "s")
        style["linestyle"] = "-" if side == "multihead" else "--"
        label = f"{side}: {method}"
        axes[0].plot(x, [r["needles_exact"] / r["needles"] for _, r in pts], label=label, **style)
        axes[1].plot(x, [r["perplexity"] for _, r in pts], label=label, **style)
    for side in ("multihead", "kvpress"):  # the full cache of each side, for reference
        full = next(
            (r for r in payload["results"] if r["side"] == side and r["method"] == "full" and "error" not in r), None
        )
        if full is not None:
            axes[1].axhline(full["perplexity"], color="grey", linestyle=":" if side == "kvpress" else "-", linewidth=1)
    c = payload["config"]
    several = f", {c['keys']} needles in each" if c.get("keys", 1) > 1 else ""
    axes[0].set_title(f"needles answered exactly ({c['needles']} prompts of {c['needle_length']} tokens{several})")
    axes[0].set_ylabel("share of needles answered")
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].set_title(f"perplexity of {c['tokens']} tokens after {c['context']} (grey: the full cache)")
    axes[1].set_ylabel("perplexity (log scale)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("share of the full cache's key/value bytes held after the prompt")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(plain(f"KV cache policies against kvpress on {Path(c['model']).name}"), fontsize=11)
    fig.tight_layout()
    return save(fig, stem)


def format_table(payload: dict) -> str:
    c = payload["config"]
    lines = [
        f"KV caches on {c['model']}: {c['needles']} needle prompts of {c['needle_length']} tokens "
        f"({c.get('keys', 1)} needle(s) each); perplexity of "
        f"{c['tokens']} tokens after {c['context']}; kvpress: {c['kvpress']}",
        f"{'side':9} {'method':30} {'asked':>5} {'held':>5} {'needles':>8} {'ppl':>8} {'KiB held':>9} "
        f"{'RSS MiB':>8} {'+peak':>6} {'prefill s':>9} {'dec tok/s':>9}",
    ]
    for r in payload["results"]:
        head = f"{r['side']:9} {r['method']:30} {r['fraction']:5.3f}"
        if "error" in r:
            lines.append(f"{head} {r['error'][:80]}")
            continue
        lines.append(
            f"{head} {r['kept_share']:5.3f} {r['needles_exact']:>4}/{r['needles']:<3} {r['perplexity']:8.3f} "
            f"{r['kv_bytes'] / 1024:9.0f} "
            f"{r['rss_mib']:8.0f} {r.get('rss_peak_added_mib') or 0:6.0f} {r['prefill_seconds']:9.2f} "
            f"{r['decode_tokens_per_s']:9.1f}"
        )
    return "\n".join(lines)


__all__ = ["FRACTIONS", "PRESSES", "default_out", "format_table", "from_args", "plot", "run"]
