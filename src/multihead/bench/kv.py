"""``multihead bench kv``: multihead's KV policies and NVIDIA's kvpress presses measured like a benchmark, on
RULER-style tasks (:mod:`multihead.data.ruler`), the same token ids and the same HF folder for both sides.

A run is every task x length x protocol x kept fraction x method, ``n`` samples per cell (default 50), scored as
RULER scores them (the share of expected strings in the greedy answer), each score with its Wilson 95% interval
(over the questions: a question's strings share one answer, so they are not counted as separate trials), the full
cache's score beside it as the ceiling.

**Protocols** (said in every row):

* ``context`` -- kvpress's pipeline: the context is read and compressed once, then each question is appended and
  answered from that compressed cache, which grows as the answer is written (the compression never sees the
  question; one compressed context serves every question);
* ``question`` -- the question read with the context (all but the question's last token compressed together, as a
  press applied to the whole prompt does), which favours methods that look at the last queries (SnapKV).

**Sides**:

* ``multihead`` -- the folder read with transformers and attached. The context is read once with every key
  (a recorded prefill), then each policy at each fraction is applied to that record
  (:meth:`~multihead.modules.kv.KVCache.compress`, bit-identical to a prefill under the policy), and scores
  once, after the context (``prompt_only``, kvpress's protocol; ``evict="always"`` keeps the budget while
  decoding);
* ``kvpress`` -- HF's own model from the same folder. The context is read once; each press then compresses that
  read's keys and values through its own ``forward_hook`` (the hook kvpress registers, called with the layer's
  recorded inputs: the cache it leaves equals the one ``with press(model)`` leaves, which the tests check), and the
  answer is written by kvpress's pipeline's own ``generate_answer``. Presses that read the attention weights
  (ObservedAttention) run their own prefill with eager attention.

**Memory** (``memory=True``): for each method and fraction, in a fresh process, one prompt of each length read under
the method the way a user runs it (a policy cache; ``with press(model)``), and the most resident memory the read
and answer add over the process after the model is loaded (the kernel's peak mark, reset after loading).

The JSON is written after every sample; a run stopped early resumes (``resume=True``) from the samples its JSON
holds, when its settings are the same.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .kvpress import EAGER, INSTALL, PRESSES, PressSide, _tensor_bytes

FRACTIONS = (0.125, 0.25, 0.5)
LENGTHS = (2048, 4096)
PROTOCOLS = ("context", "question")
EVICT = ("prompt", "always")
MAX_N = 1000
SCORING = "RULER string_match_all: the share of expected strings in the greedy answer"


def default_out() -> Path:
    return Path("bench/results") / f"kv-ruler-{time.strftime('%Y%m%d-%H%M%S')}.json"


def wilson(hits: float, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``hits`` successes in ``total`` trials (95% by default)."""
    if total == 0:
        return (0.0, 1.0)
    p = hits / total
    d = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / d
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Budget:
    """How many keys per head a policy keeps at a fraction of a context: one rule, by name in :data:`BUDGETS`, said
    in every run's config."""

    name: str
    text: str  # what the page says
    count: Callable[[float, int], int]  # keys per head at a fraction of a length
    at_most: bool  # the head-aware cache's window rounded down, so that it never holds more than the keys

    def keys(self, fraction: float, length: int) -> int:
        """Keys per head at ``fraction`` of a ``length``-token context, at least 1."""
        return max(1, self.count(fraction, length))

    def head_aware(self, fraction: float, length: int, full_heads, kv_heads):
        """The head-aware policy holding this rule's keys: the heads ``full_heads`` whole, the others a window."""
        from ..modules.kv import head_aware_at

        if self.at_most:
            return head_aware_at(self.keys(fraction, length) / length, length, full_heads, kv_heads, at_most=True)
        return head_aware_at(fraction, length, full_heads, kv_heads)


BUDGETS = {
    b.name: b
    for b in (
        Budget(
            "kvpress",
            "int(length x (1 - compression_ratio)) keys per head, at least 1, as kvpress keeps (the head-aware "
            "cache's window rounded down)",
            count=lambda f, n: int(n * (1 - (1 - f))),  # kvpress's, for compression_ratio = 1 - f, computed as it is
            at_most=True,
        ),
        Budget(
            "round",
            "round(fraction x length) keys per head, at least 1 (runs before the budget was kvpress's: up to one key "
            "per head more than kvpress keeps)",
            count=lambda f, n: round(f * n),
            at_most=False,
        ),
    )
}
BUDGET = "kvpress"  # a new run's rule; a resumed run keeps its file's


def budget_rule(name: str) -> Budget:
    """The rule ``name`` of :data:`BUDGETS`; ValueError naming the others."""
    if name not in BUDGETS:
        raise ValueError(f"unknown budget rule {name!r}; choose one of {sorted(BUDGETS)}")
    return BUDGETS[name]


def kept_keys(fraction: float, length: int, budget: str = BUDGET) -> int:
    """The keys per head a policy keeps of a ``length``-token context at ``fraction`` under the rule ``budget``
    (:data:`BUDGETS`). ``"kvpress"`` is kvpress's own count for the press made with ``compression_ratio = 1 -
    fraction``, computed the same way, so both sides hold the same bytes."""
    return budget_rule(budget).keys(fraction, length)


# ------------------------------------------------------------------------------------------------ the two sides
class OursSide:
    """The folder read with transformers and attached; one recorded read per context, each policy applied to it.
    The head-aware policy keeps every key for the top ``fraction / 2`` of key/value heads (by ``ranking``, a
    kv-heads.json's scores, else the data-free split) and a window for the others, sized so that its bytes match.
    ``budget``: how many keys a fraction is (:data:`BUDGETS`; the studies keep ``"round"``, the rule of the grids
    they pair with)."""

    side = "multihead"

    def __init__(
        self,
        folder: Path,
        ranking: list[list[float]] | None = None,
        evict: str = "prompt",
        methods=None,
        budget: str = "round",
    ) -> None:
        self.budget = budget_rule(budget)  # an unknown rule refused before the model is read
        from ..interpret.kv.heads import kv_heads_per_layer
        from ..loading import load
        from ..modules.kv import KV_POLICIES

        self.lm = load(f"hf:{folder}").detail
        self.model = self.lm.model  # AttachedLM
        self.kv_heads = kv_heads_per_layer(self.model)
        if ranking is not None and [len(r) for r in ranking] != self.kv_heads:
            raise ValueError(
                f"the kv-heads.json names {[len(r) for r in ranking]} key/value heads per layer; {folder} has "
                f"{self.kv_heads}: classify this model's heads (multihead heads MODEL --kv)"
            )
        self.ranking, self._split = ranking, {}
        # what a read records: what the run's policies read (None: every policy's)
        self.record = True if methods is None else [KV_POLICIES[n] for n in methods if n in KV_POLICIES]
        self.prompt_only = evict == "prompt"
        eos = self.model.hf.generation_config.eos_token_id
        self.stop = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def names(self) -> list[str]:
        from ..modules.kv import KV_POLICIES

        return [
            n
            for n, cls in KV_POLICIES.items()
            if n != "full" and not cls.why_not("attached") and not cls.why_not("recorded")
        ]

    def settings(self, name: str) -> dict:
        """What the policy ``name`` is here beyond the keys it keeps: the class, and the options :meth:`policy`
        leaves at their defaults (SnapKV's observation window and pooling kernel, a window's sinks, ...)."""
        import inspect

        from ..modules.kv import KV_POLICIES

        cls = KV_POLICIES[name]
        options = inspect.signature(cls.of_budget).parameters.values()
        out: dict = {"class": cls.__name__}
        out.update({o.name: o.default for o in options if o.kind is o.KEYWORD_ONLY and o.name != "full_heads"})
        if cls.needs_split:
            out["whole heads"] = "the top half of the kept fraction's share of each layer's key/value heads, " + (
                "the data-free split" if self.ranking is None else "by the given kv-heads.json"
            )
        return out

    def policy(self, name: str, fraction: float, length: int):
        """The policy ``name`` keeping ``fraction`` of a ``length``-token context's keys."""
        from ..modules.kv import KV_POLICIES, make_policy

        if name == "full":
            return make_policy("full")
        if not KV_POLICIES[name].needs_split:
            return make_policy(name, self.budget.keys(fraction, length))
        return self.budget.head_aware(fraction, length, self.split(fraction / 2), self.kv_heads)

    def split(self, share: float) -> list[list[int]]:
        """The split keeping ``share`` of the key/value heads whole: by the given ranking, else the data-free one
        (echo and induction scores)."""
        if share not in self._split:
            from ..interpret.kv.heads import echo_and_induction, kv_head_scores, split

            scores = self.ranking
            if scores is None:
                ei = echo_and_induction(self.model, half=32, batch=4, start=self.lm.bos_id or 0)
                scores = kv_head_scores(torch.maximum(ei["echo"], ei["induction"]), self.kv_heads)
            self._split[share] = split(scores, share)
        return self._split[share]

    @torch.no_grad()
    def read(self, ids: list[int], record=None):
        """``ids`` prefilled once, recording what the run's policies read (or what ``record`` names: policies, or
        their classes), so that each can then be applied to the read."""
        cache = self.model.new_cache(record=self.record if record is None else record)
        t0 = time.perf_counter()
        self.model.prefill(torch.tensor([ids]), cache=cache)
        return {"cache": cache, "length": len(ids), "seconds": time.perf_counter() - t0}

    def compressed(self, read, name: str, fraction: float):
        policy = self.policy(name, fraction, read["length"])
        probe = read["cache"].compress(policy, prompt_only=self.prompt_only)
        return {"read": read, "policy": policy, "bytes": probe.kv_nbytes(), "first": probe}

    @torch.no_grad()
    def answer(self, state, question: list[int], max_new: int) -> tuple[str, int, float]:
        cache = state.pop("first", None) or state["read"]["cache"].compress(
            state["policy"], prompt_only=self.prompt_only
        )
        logits = self.model(torch.tensor([question]), cache=cache)[:, -1]
        out: list[int] = []
        t0 = time.perf_counter()
        for i in range(max_new):
            nxt = logits.argmax(-1)
            out.append(int(nxt))
            if out[-1] in self.stop or i == max_new - 1:
                break
            logits = self.model.step(nxt, cache)
        return self.lm.decode([t for t in out if t not in self.stop]), len(out), time.perf_counter() - t0


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


# ------------------------------------------------------------------------------------------------ checks
def check(
    *,
    tasks,
    lengths,
    n,
    fractions,
    methods,
    protocols,
    evict,
    max_positions: int | None = None,
    decode: int = 0,
    budget: str | None = None,
) -> None:
    """Refuse what cannot run, before any model is read."""
    from ..data.ruler import TASKS
    from ..modules.kv import KV_POLICIES

    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or not tasks:
        raise ValueError(
            f"bench kv knows no task {', '.join(unknown) or '(none given)'}; choose from {', '.join(TASKS)}"
        )
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ValueError(f"--n is the number of samples per cell, in [1, {MAX_N}], got {n!r}")
    if not lengths or any(L < 256 for L in lengths):
        raise ValueError(f"--lengths are prompt lengths of at least 256 tokens, got {list(lengths)}")
    if max_positions is not None and max(lengths) > max_positions:
        raise ValueError(
            f"--lengths {max(lengths)} is past the {max_positions} positions the model has: ask for {max_positions} "
            "or less"
        )
    if decode and max_positions is not None and min(lengths) + decode > max_positions:
        raise ValueError(
            f"--decode {decode} after a context of {min(lengths)} tokens is past the {max_positions} positions the "
            f"model has: ask for --decode {max(max_positions - min(lengths), 0)} or less"
        )
    if not fractions or not all(0 < f <= 1 for f in fractions):
        raise ValueError(f"--fractions are kept shares of the keys in (0, 1], got {list(fractions)}")
    bad = sorted(set(protocols) - set(PROTOCOLS))
    if bad or not protocols:
        raise ValueError(f"bench kv knows no protocol {', '.join(bad) or '(none)'}; choose from {', '.join(PROTOCOLS)}")
    if evict not in EVICT:
        raise ValueError(f"--evict is one of {', '.join(EVICT)}, got {evict!r}")
    if budget is not None and budget not in BUDGETS:
        raise ValueError(f"--budget is one of {', '.join(BUDGETS)}, got {budget!r}")
    known = {"full", *PRESSES} | {
        m for m, cls in KV_POLICIES.items() if not cls.why_not("attached") and not cls.why_not("recorded")
    }
    unknown = sorted(set(methods or ()) - known)
    if unknown:
        raise ValueError(
            f"bench kv knows no method {', '.join(unknown)} (multihead's policies and kvpress's presses); choose from "
            f"{', '.join(sorted(known))}"
        )


def check_study(*, task: str, length: int, n: int, fractions, methods, protocol: str = "context") -> None:
    """A KV study's flags (the scripts beside ``bench kv``, on the default SmolLM2 folder) refused as :func:`check`
    refuses ``bench kv``'s, before any model is read."""
    check(
        tasks=[task],
        lengths=[length],
        n=n,
        fractions=list(fractions),
        methods=methods,
        protocols=[protocol],
        evict="prompt",
        max_positions=folder_positions(None),
    )


def numbers(text: str, flag: str) -> list[float]:
    """``flag``'s comma-separated numbers; ValueError naming the flag where one does not parse."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} is a comma-separated list of numbers, got {text!r}") from None


SMOLLM2_POSITIONS = 8192  # the default folder's (SmolLM2-135M), before it is written


def folder_positions(folder: Path | None) -> int | None:
    """The positions the model in ``folder`` has (None: the default SmolLM2 folder), read from its config.json
    alone; None where the config does not say."""
    if folder is None:
        from .._io import cache_home

        folder = cache_home() / "smollm2-hf"
        if not (folder / "config.json").is_file():
            return SMOLLM2_POSITIONS
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("n_positions")
    return int(value) if isinstance(value, int) else None


# ------------------------------------------------------------------------------------------------ running
def _blank(side: str, method: str, fraction: float, task: str, length: int, protocol: str) -> dict:
    return {
        "task": task,
        "length": length,
        "protocol": protocol,
        "side": side,
        "method": method,
        "fraction": fraction,
        "samples": 0,
        "questions": 0,
        "hits": 0.0,
        "expected": 0,
        "score_sum": 0.0,
        "kv_bytes_sum": 0,
        "answer_tokens": 0,
        "answer_seconds": 0.0,
        "reads": 0,
        "read_seconds_sum": 0.0,
        "examples": [],
    }


def _interval(row: dict) -> None:
    """The row's Wilson 95% interval over its questions, each question's score (the share of its expected strings
    found) counted as one trial. A question's strings share one context and one answer, so they are not independent
    trials; a score in [0, 1] with mean p has variance at most p(1 - p), so counting questions keeps the interval at
    least as wide as the questions warrant. Where a question asks one string this is the binomial interval."""
    lo, hi = wilson(row["score_sum"], row["questions"])
    row["interval"] = [round(lo, 4), round(hi, 4)]


def _intervals_again(rows: list) -> None:
    """Every row's interval worked out again from its counts: a run written before may have counted strings."""
    for r in rows:
        if isinstance(r, dict) and "score_sum" in r and "questions" in r:
            _interval(r)


def _settings(config: dict) -> dict:
    """What runs of one grid must agree on: the config less its axes. The interval is not a setting (it is worked
    out from the counts whenever rows are shown), so a scoring text that also named the interval compares equal."""
    out = {k: v for k, v in config.items() if k not in _AXES}
    out.setdefault("budget", "round")  # the rule of the runs written before a run said its rule
    if isinstance(out.get("scoring"), str):
        out["scoring"] = out["scoring"].split("; Wilson")[0]
    return out


SCORE_PLACES = 4  # each question's score is kept rounded to this many places


def _record_settings(payload: dict, settings: dict, out: Path | None) -> bool:
    """Keep each method's settings (per side: its class and the options it runs with) in ``payload``. A resumed
    run whose file holds other settings for a method it runs is refused: its rows would mix two methods under one
    name. A file written before settings were kept gets them now, with the samples it already held
    (``method_settings_from``: the rows before those counts were run by the code of then). True where the
    payload's settings changed."""
    settings = json.loads(json.dumps(settings))  # as the file holds them (tuples as lists)
    old = payload.get("method_settings")
    if old is None:
        if payload["done"]:
            payload["method_settings_from"] = dict(payload["done"])
        payload["method_settings"] = settings
        return True
    mine = [(side, method, value) for side, by_method in settings.items() for method, value in by_method.items()]
    differ = [f"{s}'s {m} ({old[s][m]}, now {v})" for s, m, v in mine if old.get(s, {}).get(m, v) != v]
    if differ:
        raise ValueError(
            f"--resume: {out} was written with other settings for {'; '.join(differ)}: its rows would mix two "
            "methods under one name; give another --out"
        )
    new = [(s, m, v) for s, m, v in mine if m not in old.get(s, {})]  # methods this run adds
    for s, m, v in new:
        old.setdefault(s, {})[m] = v
    return bool(new)


def _record(row: dict, got: float) -> None:
    """Each question's score in the order asked, so two methods can be compared question by question; kept only
    while it holds every question the row answered (a row resumed from a run that did not keep them keeps none)."""
    scores = row.get("scores", [])
    if scores is not None and len(scores) == row["questions"]:
        row["scores"] = [*scores, round(got, SCORE_PLACES)]
    else:
        row["scores"] = None


def paired(a: dict, b: dict) -> tuple[int, int, float] | None:
    """Two rows of one block compared question by question (the same questions, in the same order, on both):
    the questions ``a`` scored higher on, those ``b`` scored higher on, and the two-sided sign test's p-value over
    the questions where they differ (SciPy's exact binomial test). ``None`` where either row lacks its
    per-question scores or answered other questions."""
    sa, sb = a.get("scores"), b.get("scores")
    if not sa or not sb or len(sa) != len(sb) or len(sa) != a.get("questions") or len(sb) != b.get("questions"):
        return None
    from scipy.stats import binomtest

    wins = sum(x > y for x, y in zip(sa, sb))
    losses = sum(x < y for x, y in zip(sa, sb))
    p = binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
    return wins, losses, float(p)


def sign_test(a: list[float], b: list[float]) -> dict:
    """Two lists of per-question scores (the same questions, in the same order) compared as :func:`paired` compares
    two rows: ``better`` (``a`` higher), ``worse`` and the sign test's ``p`` (3 significant digits)."""
    got = paired({"scores": a, "questions": len(a)}, {"scores": b, "questions": len(b)})
    if got is None:
        raise ValueError(f"sign_test compares scores of the same questions: got {len(a)} and {len(b)}")
    better, worse, p = got
    return {"better": better, "worse": worse, "p": float(f"{p:.3g}")}


def _earlier(payloads: list[dict], now: dict) -> list[dict]:
    """The machines other than ``now`` (by CPU model) that the rows of ``payloads`` (runs resumed or joined) were
    measured on, once each."""
    seen = {now.get("cpu")}
    out = []
    for m in (m for p in payloads for m in (*p.get("earlier_machines", []), p.get("machine"))):
        if isinstance(m, dict) and m.get("cpu") not in seen:
            seen.add(m.get("cpu"))
            out.append(m)
    return out


def _finish(row: dict, full_bytes: float | None) -> None:
    q = max(row["questions"], 1)
    row["score"] = round(row["score_sum"] / q, 4)
    _interval(row)
    row["kv_bytes"] = round(row["kv_bytes_sum"] / q)
    row["kept_share"] = round(row["kv_bytes"] / full_bytes, 4) if full_bytes else None
    row["read_seconds"] = round(row["read_seconds_sum"] / max(row["reads"], 1), 3)
    row["decode_tokens_per_s"] = (
        round(row["answer_tokens"] / row["answer_seconds"], 2) if row["answer_seconds"] > 0 else None
    )


def _plan(sides, methods, fractions) -> list[tuple]:
    out = []
    for side in sides:
        out.append((side, "full", 1.0))
        for f in fractions:
            out += [(side, m, f) for m in side.names() if m != "full" and (not methods or m in methods)]
    return out


def run(
    *,
    folder: Path | None = None,
    tasks=None,
    lengths=(2048,),
    n: int = 50,
    fractions=FRACTIONS,
    methods=None,
    protocols=PROTOCOLS,
    evict: str = "prompt",
    ranking=None,
    seed: int = 0,
    out: Path | None = None,
    resume: bool = False,
    memory: bool = False,
    decode: int = 0,
    progress: bool = True,
    budget: str | None = None,
) -> dict:
    """Every task x length x protocol x fraction x method on ``n`` samples each, written to ``out`` after every
    sample; with ``resume``, the samples an earlier run wrote to ``out`` (same settings) are not run again.
    ``budget``: how many keys a fraction is (:data:`BUDGETS`; default kvpress's count, or a resumed file's rule)."""
    from tqdm import tqdm

    from ..data.ruler import TASKS, samples_for, score
    from .harness import machine_info, write_json

    tasks = list(tasks or TASKS)
    folder = folder or smollm2_folder()
    check(
        tasks=tasks,
        lengths=lengths,
        n=n,
        fractions=fractions,
        methods=methods,
        protocols=protocols,
        evict=evict,
        max_positions=folder_positions(folder),
        decode=decode,
        budget=budget,
    )
    config = {
        "model": str(folder),
        "tasks": tasks,
        "lengths": list(lengths),
        "n": n,
        "fractions": list(fractions),
        "methods": list(methods) if methods else "all",
        "protocols": list(protocols),
        "evict": evict,
        "head_split": "data-free" if ranking is None else "given (--kv-heads)",
        "seed": seed,
        "scoring": SCORING,
        "budget": budget or BUDGET,
    }
    payload: dict = {"suite": "kv", "config": config, "machine": machine_info(None), "results": [], "done": {}}
    if resume and out is not None and out.is_file():
        try:
            old = json.loads(out.read_text())
        except ValueError as exc:
            raise ValueError(f"--resume: {out} is not a bench kv JSON ({exc}); give another --out") from None
        if not isinstance(old, dict) or not isinstance(old.get("results"), list):
            raise ValueError(f"--resume: {out} is not a bench kv JSON (no results); give another --out")
        old_config = old.get("config") or {}
        if budget is None:  # a resumed run goes on under its file's rule
            config["budget"] = _settings(old_config)["budget"]
        same, was = _settings(json.loads(json.dumps(config))), _settings(old_config)
        differ = sorted(k for k in set(same) | set(was) if was.get(k) != same.get(k))
        if differ:
            raise ValueError(
                f"--resume: {out} was written with other settings ({', '.join(differ)}: {old.get('config')}); give the "
                "same settings or another --out (the tasks, lengths and protocols may change)"
            )
        for axis in _AXES:  # a resumed run may add or leave out tasks, lengths or protocols: it keeps what it holds
            config[axis] = _union(axis, old_config.get(axis, []), config[axis])
        payload["results"], payload["done"] = old["results"], old.get("done", {})
        _intervals_again(payload["results"])
        kept = ("decoding", "memory", "seconds", "method_settings", "method_settings_from", "joined")  # said already
        payload.update({k: old[k] for k in kept if k in old})
        earlier = _earlier([old], payload["machine"])  # where the rows it holds were measured
        if earlier:
            payload["earlier_machines"] = earlier
    ours = OursSide(folder, ranking, evict, methods=methods, budget=config["budget"])
    sides: list = [ours]
    try:
        sides.append(PressSide(folder))
        config_note = "0.5.5"
    except ImportError:
        config_note = f"kvpress is not installed here: {INSTALL}"
    payload["kvpress"] = config_note
    plan = _plan(sides, methods, fractions)
    settings = {s.side: {m: s.settings(m) for who, m, _ in plan if who is s} for s in sides}
    if _record_settings(payload, settings, out) and out is not None and payload["done"]:
        write_json(out, payload)  # a file resumed that did not keep them says them, even with nothing left to run
    rows = {
        (r["task"], r["length"], r["protocol"], r["side"], r["method"], r["fraction"]): r for r in payload["results"]
    }
    t_start = time.perf_counter()
    for task in tasks:
        for length in lengths:
            samples = None
            for protocol in protocols:
                block = f"{task}/{length}/{protocol}"
                start = payload["done"].get(block, 0)
                if start >= n:
                    continue
                samples = samples or samples_for(ours.lm, task, length=length, count=n, seed=seed)
                for side, m, f in plan:
                    key = (task, length, protocol, side.side, m, f)
                    if key not in rows:
                        rows[key] = _blank(side.side, m, f, task, length, protocol)
                        payload["results"].append(rows[key])
                bar = tqdm(range(start, n), desc=f"bench kv {block}", disable=not progress)
                for i in bar:
                    _one_sample(samples[i], protocol, sides, plan, rows, (task, length, protocol), score)
                    payload["done"][block] = i + 1
                    for side in sides:
                        full = rows[(task, length, protocol, side.side, "full", 1.0)]
                        fb = full["kv_bytes_sum"] / max(full["questions"], 1)
                        for (t, L, p, s, _, _), r in rows.items():
                            if (t, L, p, s) == (task, length, protocol, side.side):
                                _finish(r, fb)
                    payload["seconds"] = round(payload.get("seconds", 0) + time.perf_counter() - t_start, 1)
                    t_start = time.perf_counter()
                    if out is not None:
                        write_json(out, payload)
    if decode and "decoding" not in payload:
        payload["decoding"] = {
            "context": min(lengths),
            "tokens": decode,
            "rows": decode_rows(
                folder, context=min(lengths), tokens=decode, fractions=fractions, methods=methods, progress=progress
            ),
        }
        if out is not None:
            write_json(out, payload)
    if memory and "memory" not in payload:
        todo = [(s.side, m, f) for s, m, f in plan]
        payload["memory"] = memory_rows(folder, lengths, todo, evict, progress, budget=config["budget"])
        if out is not None:
            write_json(out, payload)
    return payload


def reads_of(sample, protocol: str) -> list[tuple[list[int], list[tuple[list[int], Any]]]]:
    """What a protocol reads of a sample: ``(ids read once, [(ids each answer starts from, its question)])``. Under
    ``context`` the context is read once and every question follows it; under ``question`` every question is read
    with the context, and its last token is what the answer's first logits come from."""
    if protocol == "context":
        return [(sample.ids, [(q.ids, q) for q in sample.questions])]
    return [(sample.ids + q.ids[:-1], [(q.ids[-1:], q)]) for q in sample.questions]


def _one_sample(sample, protocol, sides, plan, rows, block, score) -> None:
    """One sample through every method of both sides: each side reads each context once, every method answers
    every question from what it keeps of that read."""
    reads = reads_of(sample, protocol)
    for side in sides:
        mine = [(m, f) for s, m, f in plan if s is side]
        for context, questions in reads:
            read = side.read(context)
            for method, fraction in mine:
                row = rows[block + (side.side, method, fraction)]
                try:
                    state = side.compressed(read, method, fraction)
                    answers = [(q, *side.answer(state, ids, q.max_new_tokens)) for ids, q in questions]
                except Exception as exc:  # noqa: BLE001  a method that fails is recorded; the others still run
                    row["errors"] = row.get("errors", 0) + 1
                    row["scores"] = None  # its scores no longer line up with the other methods' questions
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    continue
                row["reads"] += 1
                row["read_seconds_sum"] += read["seconds"]
                for q, text, tokens, seconds in answers:
                    got = score(text, q.answers)
                    _record(row, got)
                    row["questions"] += 1
                    row["score_sum"] += got
                    row["hits"] += got * len(q.answers)
                    row["expected"] += len(q.answers)
                    row["kv_bytes_sum"] += state["bytes"]
                    row["answer_tokens"] += tokens
                    row["answer_seconds"] += seconds
                    if len(row["examples"]) < 2:
                        row["examples"].append({"answer": text[:200], "expected": list(q.answers)})
        for method, fraction in mine:
            rows[block + (side.side, method, fraction)]["samples"] += 1


# ------------------------------------------------------------------------------------------------ memory
def memory_rows(folder: Path, lengths, methods, evict: str, progress: bool = True, budget: str = BUDGET) -> list[dict]:
    """Per (side, method, fraction) and length: the most resident memory one read-and-answer under the method adds
    over its fresh process after loading (MiB), and the cache's tensor bytes."""
    from tqdm import tqdm

    out = []
    todo = [(L, s, m, f) for L in lengths for s, m, f in methods]
    for length, side, method, fraction in tqdm(todo, desc="bench kv memory", disable=not progress):
        spec = {"folder": str(folder), "length": length, "side": side, "method": method, "fraction": fraction}
        spec["evict"], spec["budget"] = evict, budget
        proc = subprocess.run(
            [sys.executable, "-m", "multihead.bench.kv", json.dumps(spec)], capture_output=True, text=True, timeout=900
        )
        row = {"length": length, "side": side, "method": method, "fraction": fraction}
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            row["error"] = f"exit {proc.returncode}: {tail[0][:300]}"
        else:
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        out.append(row)
    return out


@torch.no_grad()
def _memory_worker(spec: dict) -> dict:
    """In a fresh process: load, reset the peak mark, read one niah prompt under the method and answer it."""
    from .._proc import status_kib
    from ..data.ruler import samples_for

    folder, method, fraction = Path(spec["folder"]), spec["method"], spec["fraction"]
    side: Any
    if spec["side"] == "multihead":
        side = OursSide(folder, evict=spec["evict"], budget=spec.get("budget", BUDGET))
        lm = side.lm
    else:
        from ..loading import load

        lm = load(f"hf:{folder}").detail  # the tokenizer only
        side = PressSide(folder)
    sample = samples_for(lm, "niah_single_number", length=spec["length"], count=1)[0]
    q = sample.questions[0]
    start = _row_start()
    if spec["side"] == "multihead":
        policy = side.policy(method, fraction, len(sample.ids))
        cache = side.model.new_cache(policy=policy, prompt_only=side.prompt_only) if method != "full" else None
        cache = cache or side.model.new_cache(policy="full")
        side.model.prefill(torch.tensor([sample.ids]), cache=cache)
        kv = cache.kv_nbytes()
        side.model(torch.tensor([q.ids]), cache=cache)
    else:
        from contextlib import nullcontext

        from transformers import DynamicCache

        model = side.models["eager" if method in EAGER else "sdpa"]
        cache = DynamicCache()
        with nullcontext() if method == "full" else side.press(method, fraction)(model):
            model.model(input_ids=torch.tensor([sample.ids]), past_key_values=cache)
        kv = _tensor_bytes(cache)
        side.pipes["sdpa"].generate_answer(
            question_ids=torch.tensor([q.ids]), cache=cache, context_length=len(sample.ids), max_new_tokens=4
        )
    peak = None if start is None else round(max(0.0, status_kib("VmHWM") / 1024 - start), 1)
    return {"kv_bytes": kv, "peak_added_mib": peak}


# ------------------------------------------------------------------------------------------------ long decoding
DECODE_PRESSES = ("StreamingLLMPress", "SnapKVPress", "TOVAPress", "KnormPress", "ExpectedAttentionPress")


def decode_rows(
    folder: Path,
    *,
    context: int,
    tokens: int,
    fractions,
    methods=None,
    interval: int = 16,
    progress: bool = True,
) -> list[dict]:
    """A budget kept while decoding: ``tokens`` tokens of held-out text read one at a time after ``context``
    tokens, the cache capped at ``fraction x context`` keys per head. Ours: each policy keeping its budget at every
    step (``evict="always"``; SnapKV and expected attention choose once, so their caches grow). kvpress: its
    ``PrefillDecodingPress``, the press on the context and a ``DecodingPress`` around the same press compressing back
    to the cap every ``interval`` steps. Per row: perplexity of those tokens, the most and the last bytes held, decode
    tokens/s."""
    import torch.nn.functional as F
    from tqdm import tqdm

    from ..data.lm_text import held_out_rows

    ours = OursSide(folder, evict="always")
    ids = held_out_rows(ours.lm, rows=1, length=context + tokens, skip=1)
    try:
        presses: PressSide | None = PressSide(folder)
    except ImportError:
        presses = None
    plan: list[tuple[str, str, float]] = [("multihead", "full", 1.0)] + ([("kvpress", "full", 1.0)] if presses else [])
    for f in fractions:
        plan += [("multihead", m, f) for m in ours.names() if m != "full" and (not methods or m in methods)]
        if presses is not None:
            plan += [("kvpress", m, f) for m in DECODE_PRESSES if not methods or m in methods]
    out = []
    for side, method, fraction in tqdm(plan, desc="bench kv decoding", disable=not progress):
        cap = max(1, round(fraction * context))
        row: dict[str, Any] = {"side": side, "method": method, "fraction": fraction, "cap": cap}
        try:
            if side == "multihead":
                row.update(_decode_ours(ours, method, fraction, ids, context, F))
            else:
                assert presses is not None
                row.update(_decode_press(presses, method, fraction, cap, interval, ids, context, F))
        except Exception as exc:  # noqa: BLE001  a method that fails is recorded; the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out.append(row)
    return out


@torch.no_grad()
def _decode_ours(side: OursSide, method: str, fraction: float, ids, context: int, F) -> dict:
    policy = side.policy(method, fraction, context)
    cache = side.model.new_cache(policy=policy)
    logits, _ = side.model.prefill(ids[:, :context], cache=cache)
    losses, most = [], 0
    t0 = time.perf_counter()
    for t in range(context, ids.shape[1]):
        losses.append(float(F.cross_entropy(logits.float(), ids[:, t])))
        most = max(most, cache.kv_nbytes())
        if t < ids.shape[1] - 1:
            logits = side.model.step(ids[:, t], cache)
    seconds = time.perf_counter() - t0
    return _decode_result(losses, most, cache.kv_nbytes(), seconds)


@torch.no_grad()
def _decode_press(side: PressSide, method: str, fraction: float, cap: int, interval: int, ids, context: int, F) -> dict:
    from contextlib import nullcontext

    import kvpress
    from transformers import DynamicCache

    from .kvpress import make_press

    model = side.models["sdpa"]
    cache = DynamicCache()
    if method == "full":
        press = None
    else:
        press = kvpress.PrefillDecodingPress(
            prefilling_press=make_press(method, fraction),
            decoding_press=kvpress.DecodingPress(
                base_press=getattr(kvpress, method)(), compression_interval=interval, target_size=cap
            ),
        )
    losses, most = [], 0
    with nullcontext() if press is None else press(model):
        logits = model(input_ids=ids[:, :context], past_key_values=cache, logits_to_keep=1).logits[:, -1]
        t0 = time.perf_counter()
        for t in range(context, ids.shape[1]):
            losses.append(float(F.cross_entropy(logits.float(), ids[:, t])))
            most = max(most, _tensor_bytes(cache))
            if t < ids.shape[1] - 1:
                position = torch.tensor([[t]])  # its true position: a compressed cache is shorter than the text
                logits = model(input_ids=ids[:, t : t + 1], past_key_values=cache, position_ids=position).logits[:, -1]
        seconds = time.perf_counter() - t0
    return _decode_result(losses, most, _tensor_bytes(cache), seconds)


def _decode_result(losses: list[float], most: int, last: int, seconds: float) -> dict:
    return {
        "tokens": len(losses),
        "perplexity": round(math.exp(sum(losses) / len(losses)), 4),
        "kv_bytes_max": most,
        "kv_bytes_end": last,
        "decode_tokens_per_s": round((len(losses) - 1) / seconds, 2) if seconds > 0 else None,
    }


# ------------------------------------------------------------------------------------------------ the command
def from_args(args, out: Path) -> dict:
    if getattr(args, "join", None):  # runs of one grid joined: no model is read
        payload = _join_files(args.join, out)
    else:
        payload = _run_from_args(args, out)
    plot(payload, out.with_suffix(""))
    from .._io import atomic_write_text

    atomic_write_text(out.with_suffix(".md"), markdown(payload))
    return payload


def _run_from_args(args, out: Path) -> dict:
    from ..data.ruler import TASKS

    folder = Path(args.model) if getattr(args, "model", None) else None
    if folder is not None and not (folder / "config.json").is_file():
        raise ValueError(f"bench kv takes an HF causal-LM folder (config.json + safetensors); {folder} is not one")
    if (getattr(args, "keys", 1) or 1) != 1:
        raise ValueError(
            "bench kv no longer takes --keys: prompts with look-alike needles are the niah_multikey task "
            "(--tasks niah_multikey)"
        )
    if getattr(args, "context", None):
        raise ValueError(
            "bench kv no longer takes --context (perplexity after a context): it scores RULER-style tasks; a policy's "
            "perplexity under a budget is `multihead kv MODEL`'s curves"
        )
    opts: dict[str, Any] = dict(
        tasks=getattr(args, "tasks", None) or list(TASKS),
        lengths=getattr(args, "lengths", None) or [2048],
        n=50 if getattr(args, "n", None) is None else args.n,
        fractions=tuple(getattr(args, "fractions", None) or FRACTIONS),
        methods=getattr(args, "impls", None),
        protocols=getattr(args, "protocols", None) or list(PROTOCOLS),
        evict=getattr(args, "evict", None) or "prompt",
    )
    decode, budget = getattr(args, "decode", None) or 0, getattr(args, "budget", None)
    check(**opts, max_positions=folder_positions(folder), decode=decode, budget=budget)  # before any model is read
    ranking = None
    if getattr(args, "kv_heads", None):
        from .._io import read_json_file
        from ..interpret.kv.heads import ranking as rank, read_split

        read_split(args.kv_heads)
        path = Path(args.kv_heads)
        ranking = rank(read_json_file(path / "kv-heads.json" if path.is_dir() else path))
    payload = run(
        folder=folder,
        ranking=ranking,
        out=out,
        resume=bool(getattr(args, "resume", False)),
        memory=bool(getattr(args, "memory", False)),
        decode=decode,
        budget=budget,
        **opts,
    )
    return payload


_AXES = ("tasks", "lengths", "protocols")  # a grid's axes: runs that split it differ in these and agree on the rest


def _union(axis: str, a: list, b: list) -> list:
    """The values of a grid axis in either list, in the suite's order (tasks as registered, lengths ascending)."""
    from ..data.ruler import TASKS

    both = list(dict.fromkeys([*a, *b]))
    if axis == "tasks":
        return sorted(both, key=lambda t: list(TASKS).index(t) if t in TASKS else len(TASKS))
    if axis == "lengths":
        return sorted(both)
    return both


def join(payloads: list[dict]) -> dict:
    """Runs of one grid split across processes or machines (each its own ``--tasks``, ``--lengths`` or
    ``--protocols``) as one run. Their other settings (model, n, fractions, methods, eviction, head split, seed,
    scoring) must be the same; a block (task, length, protocol) measured in several keeps the run that holds more of
    its samples. Each run's machine and seconds are kept under ``joined``; memory and decoding rows are taken from the
    runs that measured them."""
    if len(payloads) < 2:
        raise ValueError("--join takes two or more bench kv JSON files, comma-separated")
    block_keys = ("task", "length", "protocol")
    for i, p in enumerate(payloads):
        config = p.get("config") if isinstance(p, dict) else None
        if (
            not isinstance(config, dict)
            or p.get("suite") != "kv"
            or not isinstance(p.get("results"), list)
            or not isinstance(p.get("done", {}), dict)
            or not all(isinstance(config.get(a), list) for a in _AXES)
            or not all(isinstance(r, dict) and all(k in r for k in block_keys) for r in p["results"])
        ):
            raise ValueError(f"--join: file {i + 1} is not a bench kv JSON")
    first = payloads[0]["config"]
    rest = _settings(first)
    for i, p in enumerate(payloads[1:], 2):
        other = _settings(p["config"])
        if other != rest:
            diff = sorted(k for k in set(rest) | set(other) if rest.get(k) != other.get(k))
            raise ValueError(
                f"--join: file {i} was run with other settings ({', '.join(diff)}); only the tasks, lengths and "
                "protocols may differ between the runs joined"
            )
    if len({str(p.get("kvpress")) for p in payloads}) > 1:
        raise ValueError("--join: the runs had different kvpress installs; join runs made with the same one")
    settings: dict = {}
    for i, p in enumerate(payloads, 1):
        for side, mine in (p.get("method_settings") or {}).items():
            for method, value in mine.items():
                if settings.setdefault(side, {}).setdefault(method, value) != value:
                    raise ValueError(
                        f"--join: file {i} ran {side}'s {method} with other settings ({value}, against "
                        f"{settings[side][method]}); join runs of the same methods"
                    )
    owner: dict[str, int] = {}  # block -> the run holding most of its samples
    for i, p in enumerate(payloads):
        for block, done in p.get("done", {}).items():
            if block not in owner or done > payloads[owner[block]]["done"][block]:
                owner[block] = i
    union: dict = {a: [] for a in _AXES}
    for p in payloads:
        union = {a: _union(a, union[a], p["config"][a]) for a in _AXES}
    out: dict = {
        "suite": "kv",
        "config": {**first, **union, "scoring": rest.get("scoring", SCORING)},
        "machine": payloads[0]["machine"],
        "results": [
            r
            for i, p in enumerate(payloads)
            for r in p["results"]
            if owner.get(f"{r['task']}/{r['length']}/{r['protocol']}") == i
        ],
        "done": {block: payloads[i]["done"][block] for block, i in owner.items()},
        "seconds": round(sum(p.get("seconds", 0) for p in payloads), 1),
        "kvpress": payloads[0].get("kvpress"),
        "joined": [{"machine": p["machine"], "seconds": p.get("seconds"), "done": p.get("done", {})} for p in payloads],
    }
    _intervals_again(out["results"])
    if settings:
        out["method_settings"] = settings
        since = {}  # per block, the samples its run held before it kept the settings
        for block, i in owner.items():
            p = payloads[i]
            before = p["done"] if not p.get("method_settings") else p.get("method_settings_from") or {}
            if block in before:
                since[block] = before[block]
        if since:
            out["method_settings_from"] = since
    earlier = _earlier(payloads, out["machine"])
    if earlier:
        out["earlier_machines"] = earlier
    memory: dict = {}
    for p in payloads:
        for m in p.get("memory", []):
            memory.setdefault((m["length"], m["side"], m["method"], m["fraction"]), m)
    if memory:
        out["memory"] = list(memory.values())
    decoding = next((p["decoding"] for p in payloads if "decoding" in p), None)
    if decoding is not None:
        out["decoding"] = decoding
    return out


def _join_files(paths: list[str], out: Path) -> dict:
    """``--join A.json,B.json``: read each run (JSON only, no model), join them and write ``out``."""
    from .._io import read_json_file
    from .harness import write_json

    payloads = []
    for path in paths:
        try:
            payloads.append(read_json_file(Path(path)))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--join: {path} cannot be read as a bench kv JSON ({exc})") from None
    payload = join(payloads)
    write_json(out, payload)
    return payload


def plot(payload: dict, stem: str | Path) -> list[Path]:
    """One figure per task: score against the share of the full cache's bytes held, rows = lengths, columns =
    protocols, a line per method (multihead's solid with circles, kvpress's dashed with squares), Wilson intervals
    drawn, the full cache's score as a grey line. PNG and SVG, ``STEM-TASK``."""
    from ..plotting import plain, pyplot, save

    plt = pyplot()
    c = payload["config"]
    written: list[Path] = []
    cmap = plt.get_cmap("tab20")
    for task in c["tasks"]:
        rows = [r for r in payload["results"] if r["task"] == task and r.get("questions")]
        if not rows:
            continue
        lengths = sorted({r["length"] for r in rows})
        protocols = [p for p in c["protocols"] if any(r["protocol"] == p for r in rows)]
        fig, axes = plt.subplots(
            len(lengths), len(protocols), figsize=(6.5 * len(protocols), 4.2 * len(lengths)), squeeze=False
        )
        pair = {m: i for i, m in enumerate(dict.fromkeys(PRESSES.get(r["method"]) or r["method"] for r in rows))}
        for i, length in enumerate(lengths):
            for j, protocol in enumerate(protocols):
                ax = axes[i][j]
                cell = [r for r in rows if r["length"] == length and r["protocol"] == protocol]
                lines = list(dict.fromkeys((r["side"], r["method"]) for r in cell if r["method"] != "full"))
                for k, (side, method) in enumerate(lines):
                    pts = sorted(
                        (r for r in cell if (r["side"], r["method"]) == (side, method)),
                        key=lambda r: r["kept_share"] or 0,
                    )
                    dodge = (k - len(lines) / 2) * 0.004  # the intervals side by side, not on top of each other
                    x = [(r["kept_share"] or 0) + dodge for r in pts]
                    y = [r["score"] for r in pts]
                    err = [[r["score"] - r["interval"][0] for r in pts], [r["interval"][1] - r["score"] for r in pts]]
                    ax.errorbar(
                        x,
                        y,
                        yerr=err,
                        color=cmap(pair[PRESSES.get(method) or method] % 20),
                        marker="o" if side == "multihead" else "s",
                        linestyle="-" if side == "multihead" else "--",
                        capsize=2,
                        label=f"{side}: {method}",
                    )
                for r in cell:
                    if r["method"] == "full":
                        ax.axhline(r["score"], color="grey", linestyle="-" if r["side"] == "multihead" else ":")
                n = max((r["samples"] for r in cell), default=0)
                ax.set_title(f"{length} tokens, {protocol} protocol (n={n})", fontsize=9)
                ax.set_xlabel("share of the full cache's key/value bytes held")
                ax.set_ylabel("score (RULER)")
                ax.set_ylim(-0.05, 1.05)
                ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.suptitle(plain(f"{task}: KV policies and kvpress presses on {Path(c['model']).name}"), fontsize=11)
        fig.tight_layout()
        written += save(fig, f"{stem}-{task}")
    return written


def markdown(payload: dict) -> str:
    """The scores as a page: per task, length and protocol, a table of methods x fractions, each cell the score with
    its Wilson 95% interval and the samples it rests on, the full cache's score in the first row."""
    c = payload["config"]
    lines = [
        f"# KV caches on RULER-style tasks: {Path(c['model']).name}",
        "",
        "Scored as RULER scores (the share of expected strings in the greedy answer), Wilson 95% intervals over the "
        "questions, each question's score one trial (a question's strings share one answer, so they are not counted "
        "as separate trials; a score in [0, 1] varies at most as a yes/no answer does, so the interval is not too "
        f"narrow); n = {c['n']} samples per cell asked (the `n` column of a cell says how many were run). "
        f"multihead's policies evict {'once, after the prompt' if c['evict'] == 'prompt' else 'at every step'} and "
        f"keep {budget_rule(_settings(c)['budget']).text}; kvpress: {payload.get('kvpress')}. Machine: "
        f"{payload['machine'].get('cpu')}"
        + "".join(f"; some rows measured on {m.get('cpu')}" for m in payload.get("earlier_machines", []))
        + ".",
    ]
    rows = [r for r in payload["results"] if r.get("questions")]
    order = {t: i for i, t in enumerate(c["tasks"])}  # the suite's order, whichever run or join wrote the rows
    blocks = sorted(
        {(r["task"], r["length"], r["protocol"]) for r in rows},
        key=lambda b: (order.get(b[0], len(order)), b[1], c["protocols"].index(b[2]) if b[2] in c["protocols"] else 0),
    )
    lines += [
        "",
        "## At equal bytes: multihead's best policy against kvpress's best press",
        "",
        "Per cell, the best-scoring method of each side at each kept fraction (the same share of the keys, so the same "
        "bytes). *Apart* means the two Wilson intervals do not overlap; *overlapping* means these samples do not tell "
        "the two apart that way. Both sides answer the same questions, so the last column compares the two methods "
        "question by question: the questions multihead's best scored higher on and lower on, and the sign test over "
        "those (a small p says the difference is not chance; `-` where a run did not keep each question's score).",
        "",
        "| task | length | protocol | kept | full cache | multihead's best | kvpress's best | verdict | question by question |",
        "|---|---:|---|---:|---:|---|---|---|---|",
    ]
    lines += [_verdict_row(rows, block, f) for block in blocks for f in sorted({r["fraction"] for r in rows}) if f < 1]
    for task, length, protocol in blocks:
        cell = [r for r in rows if (r["task"], r["length"], r["protocol"]) == (task, length, protocol)]
        fractions = sorted({r["fraction"] for r in cell if r["method"] != "full"})
        lines += ["", f"## {task}, {length} tokens, {protocol} protocol", ""]
        lines.append("| method | " + " | ".join(f"{f:g} of the keys" for f in fractions) + " |")
        lines.append("|---|" + "---|" * len(fractions))
        for r in (r for r in cell if r["method"] == "full"):
            text = f"{r['score']:.2f} [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}] n={r['samples']}"
            lines.append(f"| {r['side']}: full cache (ceiling) | " + " | ".join([text] * len(fractions)) + " |")
        for side, method in dict.fromkeys((r["side"], r["method"]) for r in cell if r["method"] != "full"):
            got = {r["fraction"]: r for r in cell if (r["side"], r["method"]) == (side, method)}
            texts = [
                f"{got[f]['score']:.2f} [{got[f]['interval'][0]:.2f}, {got[f]['interval'][1]:.2f}] n={got[f]['samples']}"
                if f in got
                else ""
                for f in fractions
            ]
            lines.append(f"| {side}: {method} | " + " | ".join(texts) + " |")
    if payload.get("memory"):
        lines += [
            "",
            "## Memory",
            "",
            "Per method and fraction, in a fresh process: the cache's tensor bytes after one prompt is read under the "
            "method, and the most resident memory the read and its answer add over the loaded model (the kernel's peak "
            "mark, reset after loading).",
            "",
            "| length | side | method | kept fraction | KV tensor KiB | peak added (MiB) |",
            "|---:|---|---|---:|---:|---:|",
        ]
        for m in payload["memory"]:
            got = f"{m['error']} | |" if "error" in m else f"{m['kv_bytes'] / 1024:.0f} | {m['peak_added_mib']} |"
            lines.append(f"| {m['length']} | {m['side']} | {m['method']} | {m['fraction']:g} | {got}")
    lines += _settings_section(payload)
    lines += ["", "## How it was made", "", *_made(payload)]
    if payload.get("joined"):
        lines += [
            "",
            "Joined from runs on: "
            + "; ".join(
                f"{j['machine'].get('cpu')} ({j.get('seconds')} s: {', '.join(j.get('done', {}))})"
                for j in payload["joined"]
            ),
        ]
    return "\n".join(lines) + "\n"


def _settings_section(payload: dict) -> list[str]:
    """The page's table of what each method is beyond the keys it keeps (empty for a file that did not keep it)."""
    settings = payload.get("method_settings")
    if not settings:
        return []

    def text(value: dict) -> str:
        return ", ".join(
            f"{k} = {text(v) if isinstance(v, dict) else v}" if k != "class" else str(v) for k, v in value.items()
        )

    lines = [
        "",
        "## What each method is",
        "",
        "Each method's class and the options it ran with (the kept fraction aside). The two sides' methods of one "
        "name may differ in these: SnapKV, for one, observes a window of the prompt's last queries whose length each "
        "side chooses.",
        "",
        "| side | method | settings |",
        "|---|---|---|",
    ]
    lines += [f"| {side} | {m} | {text(v)} |" for side, mine in settings.items() for m, v in mine.items()]
    since = payload.get("method_settings_from")
    if since:
        lines += [
            "",
            "These were kept from when this file held "
            + ", ".join(f"{b}: {k}" for b, k in since.items())
            + " samples; those samples were run before the file kept them.",
        ]
    return lines


def command(config: dict, threads: int | None = None) -> str:
    """The ``multihead bench kv`` command line that runs the grid ``config`` describes, in one process."""
    from .._io import cache_home

    words = ["multihead bench kv"]
    if Path(config["model"]) != cache_home() / "smollm2-hf":
        words.append(f"--model {config['model']}")
    words += [
        f"--tasks {','.join(config['tasks'])}",
        f"--lengths {','.join(map(str, config['lengths']))}",
        f"--n {config['n']}",
        f"--fractions {','.join(f'{f:g}' for f in config['fractions'])}",
        f"--protocols {','.join(config['protocols'])}",
    ]
    if config.get("methods") not in (None, "all"):
        words.append(f"--impls '{','.join(config['methods'])}'")
    if config.get("evict", "prompt") != "prompt":
        words.append(f"--evict {config['evict']}")
    if _settings(config)["budget"] != BUDGET:
        words.append(f"--budget {_settings(config)['budget']}")
    if config.get("head_split", "data-free") != "data-free":
        words.append("--kv-heads KV_HEADS.json")
    if threads:
        words.append(f"--threads {threads}")
    return " ".join(words) + " --out OUT.json"


def _made(payload: dict) -> list[str]:
    """The page's last section: the command that reruns the grid and what this run cost."""
    samples = sum(payload.get("done", {}).values())
    seconds = payload.get("seconds") or 0
    runs = payload.get("joined") or [{"machine": payload["machine"], "seconds": seconds}]
    threads = payload["machine"].get("threads")
    lines = [
        "From `make kvpress`'s environment (kvpress beside multihead), in one process:",
        "",
        f"    .venv-hf4/bin/{command(payload['config'], threads)}",
        "",
        "Add `--resume` to go on after a stop. The grid splits across processes or machines by `--tasks`, `--lengths` "
        "or `--protocols`, each with its own `--out`; `multihead bench kv --join A.json,B.json --out OUT.json` joins "
        "them.",
    ]
    if samples and seconds:
        lines += [
            "",
            f"This run: {samples} samples in {seconds / 3600:.1f} h of wall time summed over {len(runs)} "
            f"process{'es' if len(runs) > 1 else ''} ({seconds / samples / 60:.1f} min per sample, every method of "
            f"both sides answering it) on {threads} thread{'s' if threads != 1 else ''} per process, "
            f"{payload['machine'].get('cpu')}.",
        ]
    return lines


def _verdict_row(rows: list[dict], block: tuple, fraction: float) -> str:
    """One line of the equal-bytes summary: each side's best method at ``fraction`` in ``block``."""
    cell = [r for r in rows if (r["task"], r["length"], r["protocol"]) == block]
    full = next((r for r in cell if r["method"] == "full"), None)
    best = {}
    for side in ("multihead", "kvpress"):
        mine = [r for r in cell if r["side"] == side and r["fraction"] == fraction and r["method"] != "full"]
        best[side] = max(mine, key=lambda r: (r["score"], r["interval"][0]), default=None)
    ours, press = best["multihead"], best["kvpress"]

    def text(r):
        return "" if r is None else f"{r['method']} {r['score']:.2f} [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]"

    if ours is None or press is None:
        verdict = "one side only"
    elif ours["interval"][0] > press["interval"][1]:
        verdict = "multihead ahead, apart"
    elif press["interval"][0] > ours["interval"][1]:
        verdict = "kvpress ahead, apart"
    else:
        verdict = "overlapping" + (
            ""
            if ours["score"] == press["score"]
            else f" ({'multihead' if ours['score'] > press['score'] else 'kvpress'} higher)"
        )
    pair = None if ours is None or press is None else paired(ours, press)
    if pair is None:
        by_question = "-"
    else:
        wins, losses, p = pair
        by_question = f"{wins} better, {losses} worse (sign test p = {p:.2g})"
    ceiling = "" if full is None else f"{full['score']:.2f}"
    task, length, protocol = block
    return (
        f"| {task} | {length} | {protocol} | {fraction:g} | {ceiling} | {text(ours)} | {text(press)} | {verdict} "
        f"| {by_question} |"
    )


def format_table(payload: dict) -> str:
    c = payload["config"]
    lines = [
        f"KV caches on {c['model']}: RULER-style tasks, n={c['n']} per cell, evict={c['evict']}; kvpress: "
        f"{payload.get('kvpress')}",
        f"{'task':20} {'len':>5} {'protocol':8} {'side':9} {'method':26} {'asked':>5} {'held':>5} {'score':>6} "
        f"{'95% interval':>13} {'n':>4} {'KiB':>7} {'read s':>6} {'tok/s':>6}",
    ]
    for r in payload["results"]:
        if not r.get("questions"):
            continue
        lines.append(
            f"{r['task']:20} {r['length']:5} {r['protocol']:8} {r['side']:9} {r['method']:26} {r['fraction']:5.3f} "
            f"{(r['kept_share'] or 0):5.3f} {r['score']:6.3f} {r['interval'][0]:6.3f}-{r['interval'][1]:6.3f} "
            f"{r['samples']:4} {r['kv_bytes'] / 1024:7.0f} {r.get('read_seconds', 0):6.2f} "
            f"{r['decode_tokens_per_s'] or 0:6.1f}"
        )
    dec = payload.get("decoding")
    if dec:
        lines.append(f"a budget kept while decoding: {dec['tokens']} tokens read one at a time after {dec['context']}")
        for d in dec["rows"]:
            head = f"decode {d['side']:9} {d['method']:26} {d['fraction']:5.3f} cap {d['cap']:5}"
            lines.append(
                f"{head} {d['error']}"
                if "error" in d
                else f"{head} ppl {d['perplexity']:8.3f} KiB max {d['kv_bytes_max'] / 1024:7.0f} "
                f"end {d['kv_bytes_end'] / 1024:7.0f} {d['decode_tokens_per_s']} tok/s"
            )
    for m in payload.get("memory", []):
        lines.append(
            f"memory {m['length']:5} {m['side']:9} {m['method']:26} {m['fraction']:5.3f} "
            + (m["error"] if "error" in m else f"{m['kv_bytes'] / 1024:7.0f} KiB, +{m['peak_added_mib']} MiB peak")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(_memory_worker(json.loads(sys.argv[1]))))


__all__ = [
    "FRACTIONS",
    "PROTOCOLS",
    "check",
    "check_study",
    "command",
    "decode_rows",
    "default_out",
    "folder_positions",
    "format_table",
    "from_args",
    "join",
    "markdown",
    "numbers",
    "memory_rows",
    "paired",
    "plot",
    "run",
    "sign_test",
    "wilson",
]
