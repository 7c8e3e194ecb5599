"""Self-supervised pretraining on unlabelled text: BERT's masked-language-model objective, in a resumable run folder.

``multihead pretrain --objective mlm --data imdb --out runs/mlm`` (or ``pretrain(config, out)``):

1. **Text, never labels.** A built-in dataset contributes its texts only (``imdb``: the 25k IMDB reviews); a user
   file gives one text per line (``.txt``), or the ``--text-column`` of a ``.csv``/``.tsv``/``.jsonl``. A seeded
   share of the texts (``data.validation``) is held out, by text, and recorded in ``splits.json``.
2. **Tokenizer trained on the pretraining split** (our BPE, plus ``[MASK]``), saved as ``tokenizer.json``.
3. **Packed sequences.** Every text is tokenized once, the training texts are concatenated with ``[SEP]`` between
   them and cut into ``[CLS] + (seq_len - 2) tokens + [SEP]`` rows: no padding, every position is trained (RoBERTa's
   FULL-SENTENCES packing). The row order is reshuffled every pass, seeded.
4. **Masking** (:mod:`multihead.data.masking`): 15% of the tokens, 80/10/10, optionally whole words; the masks of
   step *n* come from a generator seeded by (seed, n), so they do not depend on when the run was resumed.
5. **Model**: a :class:`~multihead.TextEncoder` (rotary positions, embedding LayerNorm, pre-LN GELU blocks; the
   BERT layout by ``--set``) + the MLM head (:class:`~multihead.models.masked_lm.MaskedLM`), AdamW, linear warm-up
   then linear decay over ``optim.steps``. The loss and the head run on the masked positions only.
6. **Validation** every ``run.eval_every`` steps on the held-out rows with fixed masks: loss, perplexity
   (``exp(loss)`` over masked tokens) and masked-token accuracy.

Run folder (the same guarantees as ``train``: built aside and published once resumable, locked while written,
every file written atomically, ``--resume`` after a kill continues bit-identically)::

    config.json        {"pretrain": ...}
    tokenizer.json     splits.json
    metrics.jsonl      train events (loss, masked accuracy, tokens/s) and eval events
    checkpoint/        model + optimizer + RNG + schedule + position, every run.save_every steps
    model.safetensors  encoder + MLM head (tied embedding stored once)
    encoder/           the encoder as an HF BertModel folder (post-LN; a pre-LN encoder in multihead's own layout,
                       :data:`multihead.pretrained.NATIVE`): ``multihead train --init runs/mlm`` fine-tunes it
    curves.png         training and validation loss, validation perplexity
    results.json       steps, tokens, minutes, parameters, validation loss/perplexity/accuracy

One module over the usual size on purpose: the pretraining config, its data preparation, the two objectives and
the task that runs them describe one run folder format and change together.
"""

from __future__ import annotations

from typing import Literal

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import data as D
from .._config import check_rules, from_fields
from ..data.limits import limit_indices, limit_record
from ..data.masking import IGNORE, mask_tokens, word_starts
from ..data.packing import apply_text_split, batch_rows, pack, split_texts
from ..models.masked_lm import MaskedLM
from ..models.seq2seq import CausalLM, CausalLMConfig
from ..models.text_encoder import TextEncoderConfig
from ..modules.decoder import DecoderConfig
from ..modules.encoder import EncoderConfig
from .checkpoint import model_tensors
from .harness import Step, Task, run_task
from .runfolder import (
    CheckpointError,
    atomic_write_bytes,
    atomic_write_json,
    check_shapes,
    header_shapes,
    is_task_run,
    load_checked,
    meta_shapes,
    read_json,
    save_checked,
)

MASK = "[MASK]"
OBJECTIVES = ("mlm", "clm")


@dataclass
class PretrainData:
    name: str = "imdb"  # a built-in dataset (its texts only) or a .txt/.csv/.tsv/.jsonl file
    text_column: str = "text"
    validation: float = 0.02  # share of texts held out (by text, seeded)
    split_seed: int = 0
    seq_len: int = 128  # tokens per packed row, [CLS] and [SEP] included
    vocab_size: int = 8000
    min_frequency: int = 2
    limit: int | None = None  # at most N texts, a seeded sample (smoke tests)


@dataclass
class PretrainObjective:
    name: str = "mlm"  # mlm: masked LM (BERT, the `model` section) | clm: causal LM (GPT, the `causal` section)
    mask_prob: float = 0.15
    mask_replace: float = 0.8  # of the selected tokens: share replaced by [MASK]
    random_replace: float = 0.1  # ... by a random token (the rest stay unchanged)
    whole_word: bool = False


@dataclass
class PretrainOptim:
    steps: int = 3000  # MLM at the default size: ~30 min on 2 cores (the causal LM: 2,000 x 32 rows, 16.5 min)
    batch_size: int = 64  # rows per step (global, across DDP ranks)
    lr: float = 2e-3
    warmup: float = 0.06
    weight_decay: float = 0.01
    clip: float = 1.0


@dataclass
class PretrainRun:
    seed: int = 0
    threads: int | None = None
    save_every: int = 200  # steps between resumable checkpoints
    eval_every: int = 500  # steps between validations (and at the end)
    eval_rows: int = 256  # validation rows scored each time (fixed masks)
    progress: bool = True
    log: Literal["none", "tensorboard"] = "none"  # experiment tracking: TensorBoard event files in RUN/tensorboard


def _default_model() -> TextEncoderConfig:
    # Pre-LN blocks with rotary positions: BERT's own layout (post-LN, learned positions) sat on the unigram plateau
    # for a whole 45-minute CPU budget (measured: validation loss 6.19 after 1,800 steps; pre-LN with learned
    # positions 6.30 after 500 steps, barely using the context), while rotary positions give every head relative
    # offsets from the first step (4.74 after 500 steps, 4.28 after 1,000). The encoder then exports in multihead's
    # own layout (HF's BertModel holds neither), which `train --init` reads; `--set model.encoder.norm_first=false
    # --set model.positional=learned` gives the BERT layout and an HF folder. No dropout: at this size and budget the
    # model underfits (and dropout's masks cost ~20% of a CPU step).
    return TextEncoderConfig(
        vocab_size=8000,
        max_len=128,
        positional="rope",
        embed_init_std=0.02,
        embed_norm=True,
        encoder=EncoderConfig(
            d_model=128, num_heads=4, num_layers=4, d_ff=512, dropout=0.0, activation="gelu", norm_first=True
        ),
    )


def _default_causal() -> CausalLMConfig:
    # GPT-2 layout (pre-LN blocks with a final norm, GELU, tied input/output embeddings) with rotary positions, so
    # that a cache can re-number positions within a window (`multihead sinks`, StreamingLLM); sized like the MLM.
    return CausalLMConfig(
        vocab_size=8000,
        max_len=128,
        positional="rope",
        decoder=DecoderConfig(
            d_model=128,
            num_heads=4,
            num_layers=4,
            d_ff=512,
            dropout=0.0,
            activation="gelu",
            norm_first=True,
            cross_attention=False,
        ),
    )


@dataclass
class PretrainConfig:
    data: PretrainData = field(default_factory=PretrainData)
    objective: PretrainObjective = field(default_factory=PretrainObjective)
    model: TextEncoderConfig = field(default_factory=_default_model)  # the masked-LM encoder (objective mlm)
    causal: CausalLMConfig = field(default_factory=_default_causal)  # the causal LM (objective clm)
    optim: PretrainOptim = field(default_factory=PretrainOptim)
    run: PretrainRun = field(default_factory=PretrainRun)

    def __post_init__(self) -> None:
        """Ranges, checked before anything is read, allocated or written."""
        d, ob, o, r = self.data, self.objective, self.optim, self.run
        rules = [
            ("objective.name", ob.name in OBJECTIVES, f"one of {', '.join(OBJECTIVES)}"),
            ("objective.mask_prob", 0 < ob.mask_prob < 1, "in (0, 1)"),
            ("objective.mask_replace", 0 <= ob.mask_replace <= 1, "in [0, 1]"),
            (
                "objective.random_replace",
                0 <= ob.random_replace <= 1 - ob.mask_replace,
                "in [0, 1 - objective.mask_replace]",
            ),
            ("data.validation", 0 < d.validation < 0.5, "in (0, 0.5)"),
            ("data.seq_len", 8 <= d.seq_len <= 4096, "in [8, 4096]"),
            ("data.vocab_size", 16 <= d.vocab_size <= 1_000_000, "in [16, 1000000]"),
            ("data.min_frequency", d.min_frequency >= 1, ">= 1"),
            ("data.limit", d.limit is None or d.limit >= 2, ">= 2"),
            ("optim.steps", o.steps >= 1, ">= 1"),
            ("optim.batch_size", o.batch_size >= 1, ">= 1"),
            ("optim.lr", 0 < o.lr <= 10, "> 0 and at most 10"),
            ("optim.warmup", 0 <= o.warmup < 1, "in [0, 1)"),
            ("optim.weight_decay", o.weight_decay >= 0, ">= 0"),
            ("optim.clip", o.clip >= 0, ">= 0"),
            ("run.save_every", r.save_every >= 0, ">= 0 (0: only at the end)"),
            ("run.eval_every", r.eval_every >= 1, ">= 1"),
            ("run.eval_rows", r.eval_rows >= 1, ">= 1"),
        ]
        check_rules(rules)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PretrainConfig:
        return from_fields(cls, d)


def config_from_overrides(over: dict) -> PretrainConfig:
    """A pretraining config from ``multihead pretrain``'s nested overrides (TOML < flags < ``--set``), validated. For
    the causal objective the size options given for the encoder (``model.encoder.*``, what ``--d-model`` etc. set)
    shape the causal LM's decoder instead; ``causal.decoder.*`` wins over them."""
    from .config import merge

    over = json.loads(json.dumps(over))  # a copy
    objective = (over.get("objective") or {}).get("name", "mlm")
    if objective == "clm" and "encoder" in over.get("model", {}):
        sized = over["model"].pop("encoder")
        over.setdefault("causal", {})["decoder"] = merge(sized, over.get("causal", {}).get("decoder", {}))
        if not over["model"]:
            over.pop("model")
    return PretrainConfig.from_dict(merge(PretrainConfig().to_dict(), over))


def is_pretrain_run(path: str | Path) -> bool:
    return is_task_run(path, "pretrain")


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class Packed:
    tokenizer: object
    train: torch.Tensor  # (N, seq_len) int32 rows
    validation: torch.Tensor  # (M, seq_len)
    record: dict  # the split, as saved in splits.json
    texts: dict  # split name -> number of texts
    tokens: dict  # split name -> number of tokens (before packing)


def run_texts(config: PretrainConfig) -> list[str]:
    """The texts a run pretrains on: the data's, or the seeded random ``data.limit`` of them."""
    dc = config.data
    texts = D.load_texts(dc.name, text_column=dc.text_column)
    if dc.limit:  # the one meaning of limit: at most N texts, seeded (before the held-out split)
        texts = [texts[i] for i in limit_indices(len(texts), dc.limit, dc.split_seed)]
    return texts


def prepare(config: PretrainConfig, out: Path | None = None, *, resume: bool = False) -> Packed:
    dc = config.data
    texts = run_texts(config)
    if len(texts) < 2:
        raise D.DataError(
            f"--data {dc.name!r} holds {len(texts)} text(s); pretraining needs at least two (one is "
            "held out for validation)"
        )
    if resume and out is not None and (out / "splits.json").exists():
        record = read_json(out / "splits.json", dict)
    else:
        record = split_texts(len(texts), validation=dc.validation, seed=dc.split_seed)
        if dc.limit:
            record["limit"] = limit_record(dc.limit, dc.split_seed, False)
    parts = apply_text_split(texts, record, dc.name)
    if resume and out is not None and (out / "tokenizer.json").exists():
        tok = D.load_tokenizer(out / "tokenizer.json")
    else:
        tok = D.train_tokenizer(parts.train, dc.vocab_size, dc.min_frequency, extra_specials=(MASK,))
    cls_id = tok.token_to_id(D.tokenizer.CLS) if config.objective.name == "mlm" else None
    sep_id = tok.token_to_id(D.tokenizer.SEP)
    encoded = {k: [e.ids for e in tok.encode_batch(v, add_special_tokens=False)] for k, v in parts.items()}
    rows = {k: pack(v, dc.seq_len, sep_id, cls_id) for k, v in encoded.items()}
    return Packed(
        tok, rows["train"], rows["validation"], record, parts.sizes(), {k: sum(map(len, v)) for k, v in encoded.items()}
    )


# ---------------------------------------------------------------------------------------------------- objectives
def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step) % (2**63)


def mlm_loss(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Summed cross-entropy over the selected positions, their count and how many were predicted right."""
    select = labels != IGNORE
    logits = model(inputs, None, select)  # (N, V): the head runs on the selected positions only
    target = labels[select]
    loss = F.cross_entropy(logits.float(), target, reduction="sum")
    return loss, int(target.numel()), int((logits.argmax(-1) == target).sum())


def clm_loss(model: nn.Module, rows: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Summed next-token cross-entropy over every position of ``rows`` but the last, the count and the hits."""
    logits = model(rows[:, :-1])  # (B, L-1, V)
    target = rows[:, 1:]
    loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="sum")
    return loss, int(target.numel()), int((logits.argmax(-1) == target).sum())


class MaskedLMObjective:
    """BERT: corrupt 15% of the tokens (80/10/10), predict them; the model is :class:`MaskedLM`."""

    name = "mlm"

    def __init__(self, config: PretrainConfig, tok) -> None:
        ob = config.objective
        self.mask_id = tok.token_to_id(MASK)
        if self.mask_id is None:
            raise CheckpointError(f"the tokenizer has no {MASK} token; it was not trained for masked-LM pretraining")
        self.specials = torch.tensor([tok.token_to_id(t) for t in (*D.tokenizer.SPECIALS, MASK)])
        self.vocab_size = tok.get_vocab_size()
        self.prob, self.replace = ob.mask_prob, (ob.mask_replace, ob.random_replace)
        self.word_start = word_starts(tok) if ob.whole_word else None

    @staticmethod
    def model_config(config: PretrainConfig, tok) -> PretrainConfig:
        mc = {
            **config.model.to_dict(),
            "vocab_size": tok.get_vocab_size(),
            "max_len": config.data.seq_len,
            "pad_id": tok.token_to_id(D.tokenizer.PAD),
        }
        config.model = TextEncoderConfig.from_dict(mc, "model")
        return config

    @staticmethod
    def build(config: PretrainConfig) -> nn.Module:
        return MaskedLM(config.model)

    def batch(self, rows: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)``: the rows corrupted with the masks of ``seed``."""
        ids = rows.long()
        return mask_tokens(
            ids,
            maskable=~torch.isin(ids, self.specials),
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            generator=torch.Generator().manual_seed(seed),
            prob=self.prob,
            replace=self.replace,
            word_start=self.word_start,
        )

    loss = staticmethod(mlm_loss)


class CausalLMObjective:
    """GPT: predict every next token; the model is :class:`~multihead.models.CausalLM`."""

    name = "clm"

    def __init__(self, config: PretrainConfig, tok) -> None:
        pass

    @staticmethod
    def model_config(config: PretrainConfig, tok) -> PretrainConfig:
        mc = {
            **config.causal.to_dict(),
            "vocab_size": tok.get_vocab_size(),
            "max_len": config.data.seq_len,
            "pad_id": tok.token_to_id(D.tokenizer.PAD),
        }
        config.causal = CausalLMConfig.from_dict(mc)
        return config

    @staticmethod
    def build(config: PretrainConfig) -> nn.Module:
        return CausalLM(config.causal)

    @staticmethod
    def batch(rows: torch.Tensor, seed: int) -> tuple[torch.Tensor]:
        return (rows.long(),)

    loss = staticmethod(clm_loss)


OBJECTIVE_CLASSES = {"mlm": MaskedLMObjective, "clm": CausalLMObjective}


@torch.no_grad()
def evaluate_objective(
    model: nn.Module, rows: torch.Tensor, objective, *, batch_size: int = 64, seed: int = 12345
) -> dict:
    """Loss, perplexity and accuracy over the predicted tokens of ``rows`` (masked LM: masks fixed by ``seed``)."""
    was = model.training
    model.eval()
    total, n, right = 0.0, 0, 0
    for i in range(0, len(rows), batch_size):
        loss, count, correct = objective.loss(model, *objective.batch(rows[i : i + batch_size], step_seed(seed, i)))
        total, n, right = total + loss.item(), n + count, right + correct
    model.train(was)
    mean = total / max(n, 1)
    return {"loss": mean, "perplexity": math.exp(min(mean, 50.0)), "accuracy": right / max(n, 1), "tokens": n}


# ---------------------------------------------------------------------------------------------------- the run
def pretrain(
    config: PretrainConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False, given: dict | None = None
) -> dict:
    """Pretrain, validate and save a run folder; returns the results dict (also ``results.json``)."""
    return run_task(PretrainTask, config, out, resume=resume, overwrite=overwrite, given=given)


class _StepRows:
    """The global batch of every step (rows of the packed training data), computed when asked."""

    def __init__(self, steps: int, n_rows: int, batch_size: int, seed: int) -> None:
        self.steps, self.n_rows, self.batch_size, self.seed = steps, n_rows, batch_size, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> tuple[int, list[int]]:
        return step, batch_rows(step, self.n_rows, self.batch_size, self.seed)


class PretrainTask(Task):
    """MLM or CLM pretraining on the run harness: one pass of ``optim.steps`` steps over packed rows (the batch of
    step *n* and its masks depend on *n* only), validation every ``run.eval_every`` steps, the last weights kept."""

    section = "pretrain"
    keep_best = False
    config_from_overrides = staticmethod(config_from_overrides)

    def __init__(self, config: PretrainConfig, path: Path, resume: bool) -> None:
        super().__init__(config, path, resume)
        torch.manual_seed(config.run.seed)
        self.data = prepare(config, path, resume=resume)
        kind = OBJECTIVE_CLASSES[config.objective.name]
        kind.model_config(config, self.data.tokenizer)
        self.model = kind.build(config)
        self.objective = kind(config, self.data.tokenizer)
        self.validate_every = config.run.eval_every

    epochs = 1

    def total_steps(self) -> int:
        return self.config.optim.steps

    def batches(self, epoch: int) -> _StepRows:
        return _StepRows(
            self.config.optim.steps, len(self.data.train), self.config.optim.batch_size, self.config.run.seed
        )

    def write_start(self, path: Path) -> None:
        atomic_write_json(path / "config.json", {"pretrain": self.config.to_dict()})
        atomic_write_bytes(path / "tokenizer.json", self.data.tokenizer.to_str().encode())
        atomic_write_json(path / "splits.json", self.data.record)

    def loss(self, model: nn.Module, batch: tuple[int, list[int]], step: int, part: slice) -> Step:
        step, rows = batch
        # the global batch is prepared (masked) identically on every rank, then each takes its share: N ranks
        # train on exactly what one process would
        parts = self.objective.batch(self.data.train[rows], step_seed(self.config.run.seed, step))
        loss, count, correct = self.objective.loss(model, *(t[part] for t in parts))
        return Step(
            loss / max(count, 1),
            count,
            {"loss": loss.item(), "n": count, "correct": correct, "tokens": len(rows) * self.data.train.shape[1]},
        )

    def validate(self, model: nn.Module) -> dict:
        val = evaluate_objective(model, self.data.validation[: self.config.run.eval_rows], self.objective)
        return {"score": -val["loss"], **val}

    def epoch_message(self, epoch: int, event: dict) -> str:
        what = "masked" if self.config.objective.name == "mlm" else "next-token"
        return (
            f"step {event['step']}: validation loss {event['val_loss']:.4f}, perplexity "
            f"{event['val_perplexity']:.1f}, {what} accuracy {event['val_accuracy']:.4f} | "
            f"{event['minutes']:.1f} min"
        )

    def finish(self, path: Path, run: dict) -> dict:
        from .. import pretrained

        cfg = self.config
        pos = run
        save_checked(
            path / "model.safetensors",
            model_tensors(self.model),
            {"format": f"multihead.{type(self.model).__name__}", "step": str(pos["step"])},
        )
        if cfg.objective.name == "mlm":  # the encoder, for `train --init`
            pretrained.export(
                self.model.encoder,
                self.data.tokenizer,
                path / "encoder",
                overwrite=True,
                layout="auto",
                extra_config={
                    "multihead_pretraining": {
                        "objective": cfg.objective.name,
                        "steps": pos["step"],
                        "data": cfg.data.name,
                    }
                },
            )
        val = evaluate_objective(self.model, self.data.validation, self.objective)
        results = {
            "objective": cfg.objective.name,
            "data": cfg.data.name,
            "steps": pos["step"],
            "tokens": pos["tokens"],
            "minutes": pos["seconds"] / 60,
            "tokens_per_second": pos["tokens"] / max(pos["seconds"], 1e-9),
            "threads": torch.get_num_threads(),
            "world_size": run["world_size"],
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "non_embedding_parameters": sum(
                p.numel()
                for n, p in self.model.named_parameters()
                if "embed" not in n and not n.startswith("pe.") and ".pe." not in n and not n.startswith("pos.")
            ),
            "texts": self.data.texts,
            "text_tokens": self.data.tokens,
            "rows": {"train": len(self.data.train), "validation": len(self.data.validation)},
            "passes": pos["tokens"] / max(1, self.data.train.numel()),
            "validation": val,
            "encoder": str(path / "encoder") if cfg.objective.name == "mlm" else None,
        }
        plot_curves(path / "metrics.jsonl", path / "curves.png")
        return results


@dataclass
class LanguageModelRun:
    path: Path
    config: PretrainConfig
    model: nn.Module
    tokenizer: object


def load_pretrain_run(path: str | Path, device: str = "cpu") -> LanguageModelRun:
    """A finished (or checkpointed) pretraining run's model and tokenizer, checked against its config."""
    from .checkpoint import load_model_tensors

    path = Path(path)
    if not is_pretrain_run(path):
        raise CheckpointError(
            f"{path} is not a pretraining run folder (no config.json with a 'pretrain' section); "
            "make one with: multihead pretrain --objective clm --out RUN"
        )
    config = PretrainConfig.from_dict(read_json(path / "config.json", dict)["pretrain"])
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(
            f"{path} has no model.safetensors yet: the run has not finished; finish it with: "
            f"multihead pretrain --out {path} --resume"
        )
    tok = D.load_tokenizer(path / "tokenizer.json")
    build = OBJECTIVE_CLASSES[config.objective.name].build
    check_shapes(meta_shapes(lambda: build(config)), header_shapes(weights), weights)  # before anything is allocated
    model = build(config)
    tensors, _ = load_checked(weights)
    load_model_tensors(model, tensors)
    return LanguageModelRun(path, config, model.to(device).eval(), tok)


def held_out_rows(run: LanguageModelRun, length: int, *, as_trained: bool = False) -> torch.Tensor:
    """The run's held-out texts (its recorded split) tokenized, joined by ``[SEP]`` and cut into rows of ``length``
    tokens: text the model never trained on, as long as asked (e.g. several times its trained row length). With
    ``as_trained`` a masked LM's rows are ``[CLS] ... [SEP]``, as in its training."""
    cfg = run.config
    texts = run_texts(cfg)
    record = read_json(run.path / "splits.json", dict)
    if record.get("n") != len(texts):
        raise D.DataError(
            f"{cfg.data.name!r} now holds {len(texts)} texts but the run split {record.get('n')}; the "
            "data changed since the run was trained"
        )
    held = apply_text_split(texts, record, cfg.data.name).validation
    ids = [e.ids for e in run.tokenizer.encode_batch(held, add_special_tokens=False)]
    cls = run.tokenizer.token_to_id(D.tokenizer.CLS) if as_trained and cfg.objective.name == "mlm" else None
    return pack(ids, length, run.tokenizer.token_to_id(D.tokenizer.SEP), cls, option="--length")


def evaluate_run(run: LanguageModelRun) -> dict:
    """Loss, perplexity and accuracy on the run's held-out texts (its recorded split), in rows of its trained
    length; a masked LM's masks are fixed by a seed, so the numbers repeat."""
    cfg = run.config
    rows = held_out_rows(run, cfg.data.seq_len, as_trained=True)
    objective = OBJECTIVE_CLASSES[cfg.objective.name](cfg, run.tokenizer)
    return {"data": cfg.data.name, "objective": cfg.objective.name, **evaluate_objective(run.model, rows, objective)}


def plot_curves(metrics: Path, out: Path) -> None:
    """Pretraining's curves: losses by step, validation perplexity by minute (``out``: a .png)."""
    from ..plotting import Line, Panel, plot_curves as draw

    draw(
        metrics,
        out,
        (
            Panel(
                "step",
                (Line("loss", "train (masked tokens, last 50 steps)", "train", "-"), Line("val_loss", "validation")),
                "step",
                "MLM loss (nats per masked token)",
            ),
            Panel(
                "minutes",
                (Line("val_perplexity", ""),),
                "minutes of training",
                "validation perplexity (masked tokens)",
                "log",
            ),
        ),
        formats=("png",),
    )


__all__ = [
    "CausalLMObjective",
    "MaskedLMObjective",
    "OBJECTIVES",
    "OBJECTIVE_CLASSES",
    "Packed",
    "PretrainConfig",
    "LanguageModelRun",
    "batch_rows",
    "held_out_rows",
    "clm_loss",
    "evaluate_objective",
    "is_pretrain_run",
    "load_pretrain_run",
    "mlm_loss",
    "pack",
    "prepare",
    "pretrain",
]
