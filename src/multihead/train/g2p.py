"""Grapheme-to-phoneme on CMUdict: train a :class:`~multihead.Seq2Seq`, evaluate WER/PER (greedy and beam), predict.

``multihead train --data cmudict --out runs/g2p`` lands here (the task is picked from the data). The run folder
follows the same contract as the classifier's (:mod:`multihead.train.runfolder`): built beside ``--out`` and swapped in
once resumable, locked while written, every file atomic, weights in digest-checked safetensors::

    RUN/config.json       {"g2p": G2PConfig}
    RUN/vocab.json        letters and phonemes (ids 0-2: <pad> <bos> <eos>)
    RUN/splits.json       the split by word (indices into the kept CMUdict words) and the data's fingerprint
    RUN/model.safetensors best weights by validation WER (greedy)
    RUN/metrics.jsonl     training loss, validation WER/PER per epoch with the minutes elapsed
    RUN/results.json      test WER/PER, greedy and beam; timings
    RUN/curve.png/.svg    validation WER against training minutes
    RUN/checkpoint/       what --resume needs

The recipe (defaults): 3+3 pre-LN blocks, d_model 128, 4 heads, FFN 512, dropout 0.1, sinusoidal positions, tied
output embedding; AdamW (lr 1e-3, weight decay 0.01), 4% linear warm-up then cosine decay to 0, label smoothing 0.1,
gradient clipping 1.0; length-bucketed batches of 128 pronunciations.
"""

from __future__ import annotations


import time
from .epochs import EpochOptim, EpochRun, optim_rules
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import data as D
from .._config import ConfigError, check_rules, flatten, from_fields, unflatten
from ..data import g2p as G
from ..data.splits import Splits
from ..models.generation import generate
from ..models.seq2seq import Seq2Seq, Seq2SeqConfig
from ..modules.decoder import DecoderConfig
from ..modules.encoder import EncoderConfig
from .checkpoint import load_task_weights, read_task_config
from .harness import Step, Task, run_task
from .runfolder import atomic_write_json, is_task_run, read_json


@dataclass
class G2PData:
    split_seed: int = 0
    validation: float = 0.05
    test: float = 0.05
    limit: int | None = None  # at most N training words, a seeded sample (quick runs)
    eval_limit: int | None = None  # at most N words of validation and of test (None: all of them)
    test_limit: int | None = None  # test words scored at the end (quick runs); None: the whole test split


@dataclass
class G2POptim(EpochOptim):
    epochs: int = 13  # about 55 minutes on 2 cores at the default size
    lr: float = 2e-3
    warmup: float = 0.04
    weight_decay: float = 0.01


@dataclass
class G2PRun(EpochRun):
    eval_words: int = 2000  # validation words decoded (greedy) after each epoch
    beam: int = 5  # beam width of the final test evaluation


def _default_model() -> Seq2SeqConfig:
    # No dropout: at this size the model underfits CMUdict (train and validation loss stay together), and dropout's
    # random masks cost ~20% of a CPU step. Measured after one epoch (validation WER): dropout 0.1 / lr 1e-3 0.619,
    # dropout 0 / lr 1e-3 0.566, dropout 0 / lr 2e-3 0.554.
    side = dict(d_model=128, num_heads=4, num_layers=3, d_ff=512, dropout=0.0, norm_first=True)
    return Seq2SeqConfig(
        src_vocab_size=len(G.SPECIALS) + len(G.LETTERS),
        tgt_vocab_size=3,
        max_len=64,
        positional="sinusoidal",
        encoder=EncoderConfig(**side),
        decoder=DecoderConfig(**side),
    )


@dataclass
class G2PConfig:
    data: G2PData = field(default_factory=G2PData)
    model: Seq2SeqConfig = field(default_factory=_default_model)
    optim: G2POptim = field(default_factory=G2POptim)
    run: G2PRun = field(default_factory=G2PRun)

    def __post_init__(self) -> None:
        """Ranges, checked before anything is read, allocated or written."""
        o, r, d = self.optim, self.run, self.data
        rules = [
            *optim_rules(o),
            ("run.eval_words", r.eval_words >= 1, ">= 1"),
            ("run.beam", r.beam >= 1, ">= 1"),
            ("data.limit", d.limit is None or d.limit >= 1, ">= 1"),
            ("data.eval_limit", d.eval_limit is None or d.eval_limit >= 1, ">= 1"),
            ("data.test_limit", d.test_limit is None or d.test_limit >= 1, ">= 1"),
        ]
        check_rules(rules)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> G2PConfig:
        return from_fields(cls, d)


# flags of `multihead train` that mean something here: override path -> G2P config path(s)
_FLAG_PATHS = {
    "optim.epochs": ["optim.epochs"],
    "optim.batch_size": ["optim.batch_size"],
    "optim.lr": ["optim.lr"],
    "optim.weight_decay": ["optim.weight_decay"],
    "optim.warmup": ["optim.warmup"],
    "optim.clip": ["optim.clip"],
    "model.encoder.d_model": ["model.encoder.d_model", "model.decoder.d_model"],
    "model.encoder.num_heads": ["model.encoder.num_heads", "model.decoder.num_heads"],
    "model.encoder.num_kv_heads": ["model.encoder.num_kv_heads", "model.decoder.num_kv_heads"],
    "model.encoder.num_layers": ["model.encoder.num_layers", "model.decoder.num_layers"],
    "model.encoder.d_ff": ["model.encoder.d_ff", "model.decoder.d_ff"],
    "model.encoder.dropout": ["model.encoder.dropout", "model.decoder.dropout"],
    "model.encoder.backend": ["model.encoder.backend", "model.decoder.backend"],
    "model.encoder.norm_first": ["model.encoder.norm_first", "model.decoder.norm_first"],
    "model.positional": ["model.positional"],
    "data.limit": ["data.limit"],
    "data.eval_limit": ["data.eval_limit"],
    "run.seed": ["run.seed"],
    "run.threads": ["run.threads"],
    "run.progress": ["run.progress"],
}


def config_from_overrides(over: dict) -> G2PConfig:
    """A G2P config from ``multihead train``'s layered overrides (flags, TOML, ``--set``): the shared flags map onto
    both encoder and decoder; a G2P-specific field is reachable with ``--set`` (``--set optim.label_smoothing=0``);
    flags that only mean something for classification are refused by name."""
    flat = flatten(over)
    flat.pop("data.name", None)
    base = flatten(G2PConfig().to_dict())
    out = dict(base)
    unknown = []
    for key, value in flat.items():
        if key in _FLAG_PATHS:
            for target in _FLAG_PATHS[key]:
                out[target] = value
        elif key in base:
            out[key] = value
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(
            f"invalid config: {', '.join(sorted(unknown))} do not apply to grapheme-to-phoneme training "
            f"(--data cmudict); its fields are: {', '.join(sorted(base))}"
        )
    return G2PConfig.from_dict(unflatten(out))


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class G2PPrepared:
    splits: Splits  # of Lexicon parts (their record: what splits.json holds)
    vocab: G.G2PVocab


def prepare(config: G2PConfig, out: Path | None = None, *, resume: bool = False) -> G2PPrepared:
    lex = G.load_cmudict()
    if resume and out is not None and (out / "splits.json").exists():
        record = read_json(out / "splits.json", dict)
    else:
        record = G.split_words(
            lex, seed=config.data.split_seed, validation=config.data.validation, test=config.data.test
        )
    splits = G.apply_split(lex, record).limit(
        config.data.limit, config.data.split_seed, eval_keep=config.data.eval_limit
    )
    vocab = (
        G.G2PVocab.from_dict(read_json(out / "vocab.json", dict))
        if resume and out is not None
        else G.G2PVocab.from_lexicon(lex)
    )
    return G2PPrepared(splits, vocab)


def _model_config(config: G2PConfig, vocab: G.G2PVocab) -> Seq2SeqConfig:
    mc = config.model.to_dict()
    mc.update(src_vocab_size=len(vocab.letters), tgt_vocab_size=len(vocab.phonemes), pad_id=G.PAD, bos_id=G.BOS)
    return Seq2SeqConfig.from_dict(mc)


# ---------------------------------------------------------------------------------------------------- decoding
MAX_BEAM = 64


@torch.no_grad()
def transcribe(
    model: Seq2Seq, vocab: G.G2PVocab, words: list[str], *, beam: int = 1, batch_size: int = 256, device="cpu"
) -> list[list[str]]:
    """Pronunciations of ``words`` (already checked), greedy (``beam=1``) or beam search (``beam`` up to
    :data:`MAX_BEAM`: each step scores beam x vocabulary hypotheses per word)."""
    if not 1 <= beam <= MAX_BEAM:
        raise ValueError(f"beam must be in [1, {MAX_BEAM}], got {beam}")
    enc = [vocab.encode_word(w) for w in words]
    out: list[list[str] | None] = [None] * len(words)
    max_new = model.config.max_len - 1
    for idx, src, keep in D.length_sorted(enc, batch_size):
        opts = dict(strategy="beam", num_beams=beam) if beam > 1 else dict(strategy="greedy")
        got = generate(model, src.to(device), keep.to(device), max_new_tokens=max_new, stop_tokens=(G.EOS,), **opts)
        for i, toks in zip(idx, got.tokens):
            out[i] = vocab.decode_phones(toks)
    return out  # type: ignore[return-value]


def evaluate_lexicon(model: Seq2Seq, vocab: G.G2PVocab, lex: G.Lexicon, *, beam: int = 1, device="cpu") -> dict:
    preds = transcribe(model, vocab, lex.words, beam=beam, device=device)
    return {**G.score(preds, lex.prons), "beam": beam}


# ---------------------------------------------------------------------------------------------------- training
def train_g2p(
    config: G2PConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False, given: dict | None = None
) -> dict:
    """Train, evaluate and save a G2P run folder; returns ``results.json``'s contents."""
    return run_task(G2PTask, config, out, resume=resume, overwrite=overwrite, given=given)


class G2PTask(Task):
    """Grapheme-to-phoneme on the run harness: teacher-forced cross-entropy over phonemes, greedy WER on a slice of
    the validation words as the score (lower WER is better)."""

    section = "g2p"
    config_from_overrides = staticmethod(config_from_overrides)
    schedule = "cosine"
    log_every = 100
    reports_accuracy = False

    def __init__(self, config: G2PConfig, path: Path, resume: bool) -> None:
        super().__init__(config, path, resume)
        torch.manual_seed(config.run.seed)
        self.prep = prepare(config, path, resume=resume)
        config.model = _model_config(config, self.prep.vocab)
        self.model = Seq2Seq(config.model)
        self.src, self.tgt = G.as_tensor_pairs(self.prep.vocab, self.prep.splits["train"])
        self.lengths = [len(s) + len(t) for s, t in zip(self.src, self.tgt)]
        val = self.prep.splits["validation"]
        self.val_lex = val.subset(list(range(min(config.run.eval_words, len(val)))))

    def write_start(self, path: Path) -> None:
        atomic_write_json(path / "config.json", {"g2p": self.config.to_dict()})
        atomic_write_json(path / "vocab.json", self.prep.vocab.to_dict())
        atomic_write_json(path / "splits.json", self.prep.splits.record)

    def batches(self, epoch: int) -> list[list[int]]:
        return D.bucketed_batches(self.lengths, self.config.optim.batch_size, seed=self.config.run.seed, epoch=epoch)

    def loss(self, model: nn.Module, batch: list[int], step: int, part: slice) -> Step:
        local = batch[part]
        s, s_keep, t_in, t_out, t_keep = G.collate_pairs([self.src[i] for i in local], [self.tgt[i] for i in local])
        logits = model(s, t_in, s_keep, t_keep)  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1), t_out.flatten(), ignore_index=-100, label_smoothing=self.config.optim.label_smoothing
        )
        n = int((t_out != -100).sum())
        return Step(loss, n, {"loss": loss.item() * n, "n": n})

    def validate(self, model: nn.Module) -> dict:
        model.eval()
        scores = evaluate_lexicon(model, self.prep.vocab, self.val_lex)
        return {"score": -scores["wer"], "wer": scores["wer"], "per": scores["per"], "words": scores["words"]}

    def finish(self, path: Path, run: dict) -> dict:
        return _finish(path, self.config, self.prep, minutes=run["seconds"] / 60)

    def epoch_message(self, epoch: int, event: dict) -> str:
        return (
            f"epoch {epoch + 1}: loss {event['train_loss']:.4f} | validation WER {event['val_wer']:.4f} PER "
            f"{event['val_per']:.4f}{' *' if event['best'] else ''} | {event['minutes']:.1f} min"
        )


def _finish(path: Path, config: G2PConfig, prep: G2PPrepared, *, minutes: float) -> dict:
    run = load_g2p_run(path)
    test = prep.splits["test"]
    if config.data.test_limit:
        test = test.subset(list(range(min(config.data.test_limit, len(test)))))
    t = time.perf_counter()
    greedy = evaluate_lexicon(run.model, run.vocab, test)
    greedy_s = time.perf_counter() - t
    t = time.perf_counter()
    beam = evaluate_lexicon(run.model, run.vocab, test, beam=config.run.beam)
    results = {
        "task": "g2p",
        "dataset": "cmudict",
        "test_greedy": greedy,
        "test_beam": beam,
        "train_minutes": minutes,
        "threads": config.run.threads,
        "params": sum(p.numel() for p in run.model.parameters()),
        "words": prep.splits.sizes(),
        "decode_seconds": {"greedy": greedy_s, "beam": time.perf_counter() - t},
    }
    atomic_write_json(path / "results.json", results)
    plot_curve(path)
    print(  # the result, with or without progress bars (--no-progress hides the bars only)
        f"test ({greedy['words']} words): greedy WER {greedy['wer']:.4f} PER {greedy['per']:.4f}; beam "
        f"{config.run.beam} WER {beam['wer']:.4f} PER {beam['per']:.4f} (without stress: "
        f"{beam['wer_no_stress']:.4f} / {beam['per_no_stress']:.4f}); {minutes:.1f} min of training"
    )
    return results


def plot_curve(path: Path) -> None:
    """Validation word and phoneme error rates against training minutes (``curve.png``/``.svg``)."""
    from ..plotting import Line, Panel, plot_curves as draw

    lines = (
        Line("val_wer", "word error rate", scale=100.0),
        Line("val_per", "phoneme error rate", style="s-", scale=100.0),
    )
    draw(
        path / "metrics.jsonl",
        path / "curve",
        (Panel("minutes", lines, "training minutes", "validation error (%)"),),
        title="CMUdict G2P: validation error against training time",
    )


# ---------------------------------------------------------------------------------------------------- loading
@dataclass
class G2PRunFolder:
    path: Path
    config: G2PConfig
    vocab: G.G2PVocab
    model: Seq2Seq


def is_g2p_run(path: str | Path) -> bool:
    return is_task_run(path, "g2p")


def load_g2p_run(path: str | Path, device: str = "cpu") -> G2PRunFolder:
    """Rebuild a G2P model from its run folder (config validated, shapes checked against the weights' header)."""
    path = Path(path)
    config = read_task_config(path, "g2p", G2PConfig)
    vocab = G.G2PVocab.from_dict(read_json(path / "vocab.json", dict))
    return G2PRunFolder(path, config, vocab, load_task_weights(path, config, Seq2Seq).to(device))


def predict_words(run: G2PRunFolder, words: list[str], *, beam: int = 1) -> list[dict]:
    checked = [G.check_word(w) for w in words]
    prons = transcribe(run.model, run.vocab, checked, beam=beam)
    return [{"word": w, "phonemes": " ".join(p)} for w, p in zip(checked, prons)]


def evaluate_run(run: G2PRunFolder, split: str = "test", *, beam: int = 1) -> dict:
    if split not in ("train", "validation", "test"):
        raise ValueError(f"--split must be train, validation or test for a G2P run, got {split!r}")
    lex = G.load_cmudict()
    splits = G.apply_split(lex, read_json(run.path / "splits.json", dict))
    return {**evaluate_lexicon(run.model, run.vocab, splits[split], beam=beam), "split": split}


__all__ = [
    "G2PConfig",
    "config_from_overrides",
    "evaluate_run",
    "is_g2p_run",
    "load_g2p_run",
    "predict_words",
    "train_g2p",
    "transcribe",
]
