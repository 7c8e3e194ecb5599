"""Generation with a KV cache: greedy, sampling (temperature, top-k, top-p) and beam search (length penalty, early
stop), for any model with the decoding protocol (``prefill``/``step``, see :mod:`multihead.models.seq2seq`).

``generate(model, *inputs, strategy=..., max_new_tokens=..., stop_tokens=...)`` returns a :class:`Generated`:
the new tokens of every input (stop token excluded), their scores, and -- when ``output_attentions=True`` -- the
per-step self- and cross-attention weights of every layer (read through the modules' ``hook_pattern``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

STRATEGIES = ("greedy", "sample", "beam")


TEMPERATURES = (1e-3, 1e3)  # below 1e-3 logits / T overflow fp32 (use greedy); above 1e3 sampling is uniform


@dataclass
class GenerationConfig:
    strategy: str = "greedy"
    max_new_tokens: int = 32
    stop_tokens: tuple[int, ...] = ()
    temperature: float = 1.0  # sample
    top_k: int = 0  # sample: keep the k most likely tokens (0: all)
    top_p: float = 1.0  # sample: keep the smallest set whose probability reaches p (nucleus)
    num_beams: int = 4  # beam
    length_penalty: float = 1.0  # beam: hypotheses ranked by log p / length ** length_penalty
    early_stopping: bool = True  # beam: stop a row once num_beams hypotheses have finished
    seed: int | None = None  # sample
    output_attentions: bool = False
    suppress_tokens: tuple[int, ...] = ()  # never chosen (their logits set to -inf before every choice)
    begin_suppress_tokens: tuple[int, ...] = ()  # not chosen as the first new token (Whisper: no blank, no end)
    # a KV cache policy (a name in multihead.modules.kv.KV_POLICIES or a KVPolicy) and its budget
    kv_policy: object = None
    kv_budget: int | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {STRATEGIES}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (TEMPERATURES[0] <= self.temperature <= TEMPERATURES[1]):  # NaN fails too
            raise ValueError(
                f"temperature must be in [{TEMPERATURES[0]}, {TEMPERATURES[1]:g}], got {self.temperature} "
                "(below it the softmax overflows; use strategy='greedy' for argmax)"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.num_beams < 1:
            raise ValueError("top_k must be >= 0 and num_beams >= 1")
        self.stop_tokens = tuple(int(t) for t in self.stop_tokens)
        self.suppress_tokens = tuple(int(t) for t in self.suppress_tokens)
        self.begin_suppress_tokens = tuple(int(t) for t in self.begin_suppress_tokens)
        bad = [t for t in self.suppress_tokens + self.begin_suppress_tokens if t < 0]
        if bad:
            raise ValueError(f"suppressed token ids must be >= 0, got {bad}")


def _suppress(logits: Tensor, config: GenerationConfig, first: bool) -> Tensor:
    """``logits`` ``(B, V)`` with the suppressed tokens (and, at the first step, the begin-suppressed ones) at -inf."""
    ids = config.suppress_tokens + (config.begin_suppress_tokens if first else ())
    if not ids:
        return logits
    ids = [i for i in ids if i < logits.shape[-1]]  # ids past the vocabulary can never be chosen anyway
    logits = logits.clone()
    logits[:, ids] = float("-inf")
    return logits


@dataclass
class Generated:
    tokens: list[list[int]]  # new tokens per input, stop token excluded
    scores: list[float]  # sum of log-probabilities (beam: length-penalised)
    attentions: list[dict] = field(default_factory=list)  # per step: {"self": [(B, H, 1, L)], "cross": [...]}


@torch.no_grad()
def generate(model, *inputs, config: GenerationConfig | None = None, streamer=None, **options) -> Generated:
    """Generate from ``model.prefill(*inputs)`` (a CausalLM: left-padded ``ids, keep``; a Seq2Seq: ``src,
    src_keep``). ``options`` are :class:`GenerationConfig` fields. ``streamer(tokens (B,), alive (B,))`` is called
    after every step (greedy and sampling) with the tokens just chosen and which rows are still generating."""
    config = GenerationConfig(**options) if config is None else config
    if streamer is not None and config.strategy == "beam":
        raise ValueError(
            "beam search cannot stream: its best hypothesis is known only at the end; use greedy or "
            "sample with a streamer"
        )
    was_training = model.training
    model.eval()
    try:
        with _attention_recorder(model, config.output_attentions) as record:
            if config.strategy == "beam":
                return _beam(model, inputs, config, record)
            return _sample_or_greedy(model, inputs, config, record, streamer)
    finally:
        model.train(was_training)


def sampling_distribution(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The distribution sampling draws from, ``(..., V)``: ``logits / temperature``, then every token less likely
    than the ``top_k``-th set to 0 (0: none; ties with it kept), then every token after the smallest set whose
    probability reaches ``top_p`` (the nucleus), then softmax. The explain page recomputes exactly this."""
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # tokens after the nucleus is complete
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits.softmax(-1)


def _pick(logits: Tensor, config: GenerationConfig, gen) -> Tensor:
    if config.strategy == "greedy":
        return logits.argmax(-1)
    probs = sampling_distribution(logits, config.temperature, config.top_k, config.top_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _prefill(model, inputs, config: GenerationConfig):
    """The prompt read into a new cache, under the config's KV policy if it names one: ``(logits, cache)``."""
    if config.kv_policy is None:
        return model.prefill(*inputs)
    if not hasattr(model, "check_policy"):
        raise ValueError(f"KV policies serve decoder-only language models; {type(model).__name__} has none")
    return model.prefill(*inputs, cache=model.new_cache(policy=config.kv_policy, budget=config.kv_budget))


def _sample_or_greedy(model, inputs, config: GenerationConfig, record, streamer=None) -> Generated:
    gen = None
    if config.strategy == "sample":
        gen = torch.Generator(device=inputs[0].device)
        gen.manual_seed(config.seed if config.seed is not None else torch.seed())
    logits, cache = _prefill(model, inputs, config)
    record.step()
    b = logits.shape[0]
    done = torch.zeros(b, dtype=torch.bool, device=logits.device)
    scores = torch.zeros(b, dtype=torch.float64, device=logits.device)
    stops = torch.tensor(config.stop_tokens, dtype=torch.long, device=logits.device)
    picked, alive = [], []  # per step: (B,) tokens and whether each row was still generating
    for t in range(config.max_new_tokens):
        logits = _suppress(logits, config, first=t == 0)
        nxt = _pick(logits, config, gen)  # (B,)
        logp = logits.float().log_softmax(-1).gather(-1, nxt[:, None]).squeeze(-1)
        scores += logp.double() * ~done
        is_stop = torch.isin(nxt, stops)
        picked.append(nxt)
        alive.append(~done & ~is_stop)
        if streamer is not None:
            streamer(nxt, alive[-1])
        done |= is_stop
        if t == config.max_new_tokens - 1 or (len(stops) and bool(done.all())):
            break
        logits = model.step(nxt, cache)
        record.step()
    toks, keep = torch.stack(picked, 1).tolist(), torch.stack(alive, 1).tolist()  # (B, steps)
    tokens = [[x for x, k in zip(row, ks) if k] for row, ks in zip(toks, keep)]
    return Generated(tokens, scores.tolist(), record.steps)


def _beam(model, inputs, config: GenerationConfig, record) -> Generated:
    """Beam search: ``num_beams`` hypotheses per input; a hypothesis ends at a stop token (or ``max_new_tokens``) and
    is ranked by ``sum log p / length ** length_penalty``."""
    k = config.num_beams
    logits, cache = _prefill(model, inputs, config)
    record.step()
    b, v = logits.shape
    cache.reorder(torch.arange(b, device=logits.device).repeat_interleave(k))  # (B * K) rows
    logp = _suppress(logits.float(), config, first=True).log_softmax(-1).repeat_interleave(k, 0)  # (B*K, V)
    beam_scores = torch.full((b, k), float("-inf"), device=logits.device)
    beam_scores[:, 0] = 0.0  # all beams start identical: keep one so the first step picks k distinct tokens
    seqs: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(b)]
    finished: list[list[tuple[float, list[int], float]]] = [[] for _ in range(b)]
    done = [False] * b
    stops = set(config.stop_tokens)

    def ranked(total: float, length: int) -> float:
        return total / max(length, 1) ** config.length_penalty

    for t in range(config.max_new_tokens):
        cand = (beam_scores.view(-1, 1) + logp).view(b, k * v)  # (B, K*V)
        top_scores, top_idx = cand.topk(min(2 * k, k * v), dim=-1)
        parents = torch.zeros(b, k, dtype=torch.long)
        next_tokens = torch.zeros(b, k, dtype=torch.long)
        new_scores = torch.full((b, k), float("-inf"))
        new_seqs = [[[] for _ in range(k)] for _ in range(b)]
        for i in range(b):
            if done[i]:
                parents[i] = torch.arange(k)
                new_seqs[i] = seqs[i]
                continue
            slot = 0
            for score, idx in zip(top_scores[i].tolist(), top_idx[i].tolist()):
                beam, tok = divmod(idx, v)
                if score == float("-inf"):
                    break
                if tok in stops:  # a finished hypothesis (stop token not included)
                    finished[i].append((ranked(score, len(seqs[i][beam]) + 1), seqs[i][beam], score))
                    continue
                parents[i, slot], next_tokens[i, slot], new_scores[i, slot] = beam, tok, score
                new_seqs[i][slot] = seqs[i][beam] + [tok]
                slot += 1
                if slot == k:
                    break
            if len(finished[i]) >= k and config.early_stopping:
                done[i] = True
        seqs, beam_scores = new_seqs, new_scores.to(beam_scores.device)
        if all(done) or t == config.max_new_tokens - 1:
            break
        rows = (torch.arange(b)[:, None] * k + parents).view(-1).to(logits.device)
        cache.reorder(rows)
        logp = _suppress(
            model.step(next_tokens.view(-1).to(logits.device), cache).float(), config, first=False
        ).log_softmax(-1)
        record.step(rows)
    tokens, scores = [], []
    for i in range(b):
        pool = finished[i] or []
        if not done[i]:  # unfinished beams compete too (they ran out of max_new_tokens)
            pool = pool + [
                (ranked(float(beam_scores[i, j]), len(seqs[i][j])), seqs[i][j], float(beam_scores[i, j]))
                for j in range(k)
                if beam_scores[i, j] > float("-inf")
            ]
        best = max(pool, key=lambda h: h[0])
        tokens.append(best[1])
        scores.append(best[0])
    return Generated(tokens, scores, record.steps)


class _Recorder:
    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.current: dict = {"self": [], "cross": []}
        self.enabled = False

    def step(self, rows: Tensor | None = None) -> None:
        if self.enabled:
            self.steps.append(self.current)
            self.current = {"self": [], "cross": []}


@contextmanager
def _attention_recorder(model, enabled: bool):
    """While generating with ``output_attentions``: each layer's self- and cross-attention weights per step."""
    rec = _Recorder()
    rec.enabled = enabled
    handles = []
    if enabled:
        for layer in model.decoder.layers:
            handles.append(
                layer.self_attn.hook_pattern.add_hook(lambda w, hook: rec.current["self"].append(w.detach().cpu()))
            )
            if layer.cross_attn is not None:
                handles.append(
                    layer.cross_attn.hook_pattern.add_hook(
                        lambda w, hook: rec.current["cross"].append(w.detach().cpu())
                    )
                )
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


__all__ = ["GenerationConfig", "Generated", "STRATEGIES", "generate", "sampling_distribution"]
