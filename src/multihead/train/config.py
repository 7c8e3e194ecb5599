"""Training configuration: one dataclass per concern, saved together in the run folder's ``config.json``."""

from __future__ import annotations

from typing import Literal

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._config import ConfigError, from_fields
from ..models.classifier import ClassifierConfig
from ..modules.encoder import EncoderConfig


@dataclass
class DataConfig:
    name: str = "rotten_tomatoes"  # built-in name or a .csv/.tsv/.jsonl path
    text_column: str = "text"
    label_column: str = "label"
    split_seed: int = 0  # the split is fixed by this seed, independent of the training seed
    validation: float = 0.1
    test: float = 0.1
    max_len: int = 256  # tokens per text, [CLS] and [SEP] included; longer texts are cut (and counted)
    vocab_size: int = 10000
    min_frequency: int = 2
    limit: int | None = None  # at most N training examples, seeded, stratified by label (quick runs)
    eval_limit: int | None = None  # at most N examples of validation and of test (None: all of them)


@dataclass
class OptimConfig:
    epochs: int = 5
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of all steps with linear warm-up, then linear decay to 0
    clip: float = 1.0  # max gradient norm (0: off)
    patience: int = 3  # stop after this many epochs without a better validation score (0: off)
    select: str = "accuracy"  # the validation score for the best checkpoint and early stopping: accuracy | loss
    label_smoothing: float = 0.0
    # Token-embedding initialisation: "svd" = unit-norm rows of a truncated SVD of the training split's
    # token-document matrix (latent semantic analysis; training texts only, so still "from scratch");
    # "model" = the model config's random init. Measured on rotten_tomatoes, 5 seeds: +1.5 points, half the spread.
    embed_init: str = "svd"
    token_dropout: float = 0.0  # training only: replace this fraction of word tokens by [UNK] (word dropout)
    ema_decay: float = 0.995  # >0: evaluate and save an exponential moving average of the weights (0: off)


@dataclass
class RunConfig:
    seed: int = 0
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda | cuda:N
    threads: int | None = None  # torch threads (None: what torch picks); reported with every timing
    compile: bool = False  # torch.compile the model (slow first step; no gain measured on a 2-core CPU)
    save_every: int = 200  # steps between resumable checkpoints (and at every epoch end)
    progress: bool = True
    log: Literal["none", "tensorboard"] = "none"  # experiment tracking: TensorBoard event files in RUN/tensorboard


@dataclass
class PretrainedConfig:
    # "minilm" or a BERT-family folder: fine-tune its encoder with a fresh classification head. The architecture
    # and tokenizer then come from the checkpoint; model.pooling, model.encoder.backend/unpad still apply.
    name: str | None = None
    layer_decay: float = 1.0  # layer-wise lr: block i of N gets lr * decay^(N - i), embeddings lr * decay^(N + 1)


# What `--init` changes besides the weights (applied before a config file and flags, which still win).
# Chosen on rotten_tomatoes' validation split; see docs/pretrained-encoders.md.
FINETUNE_DEFAULTS = {
    "optim": {
        "lr": 1e-4,
        "epochs": 3,
        "batch_size": 32,
        "warmup": 0.1,
        "weight_decay": 0.01,
        "patience": 2,
        "embed_init": "model",
        "ema_decay": 0.0,
    },
}


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    # A small model suits a 2-core CPU and 7k-sentence data sets; measured on rotten_tomatoes (3 seeds): learned
    # positions and N(0, 0.02) embeddings beat sinusoidal + N(0, 1) by ~3 points and converge in 2-5 epochs.
    model: ClassifierConfig = field(
        default_factory=lambda: ClassifierConfig(
            positional="learned",
            embed_init_std=0.02,
            encoder=EncoderConfig(d_model=64, num_heads=4, num_layers=1, d_ff=128, dropout=0.3),
        )
    )
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        if not isinstance(d, dict):
            raise ConfigError(
                f"invalid config: a train config is a table with sections data, model, optim, run, "
                f"pretrained; got {type(d).__name__}"
            )
        d = dict(d)
        unknown = set(d) - {"data", "model", "optim", "run", "pretrained"}
        if unknown:
            raise ConfigError(
                f"invalid config: unknown sections {sorted(map(str, unknown))}; use data, model, optim, run, pretrained"
            )
        config = cls(
            data=from_fields(DataConfig, d.get("data", {}), "data"),
            model=from_fields(ClassifierConfig, d["model"], "model") if "model" in d else cls().model,
            optim=from_fields(OptimConfig, d.get("optim", {}), "optim"),
            run=from_fields(RunConfig, d.get("run", {}), "run"),
            pretrained=from_fields(PretrainedConfig, d.get("pretrained", {}), "pretrained"),
        )
        _check(config)
        return config


def layered(explicit: dict | None = None) -> TrainConfig:
    """Config layering, one place: defaults < fine-tuning defaults (when ``explicit`` names a pretrained encoder, as
    ``--init`` does) < ``explicit`` (a TOML file < flags < ``--set``, merged in that order by the caller).
    Validated (types, ranges, ceilings) before it is returned."""
    explicit = explicit or {}
    base = TrainConfig().to_dict()
    if isinstance(explicit.get("pretrained"), dict) and explicit["pretrained"].get("name"):
        base = merge(base, FINETUNE_DEFAULTS)
        positions = _pretrained_positions(explicit["pretrained"]["name"])
        if positions:  # unless --max-len says otherwise, texts are cut to what the encoder has positions for
            base["data"]["max_len"] = min(base["data"]["max_len"], positions)
    return TrainConfig.from_dict(merge(base, explicit))


def _pretrained_positions(name) -> int | None:
    from .. import pretrained

    try:
        return int(pretrained.read_hf_config(pretrained.resolve(str(name))).get("max_position_embeddings") or 0) or None
    except (pretrained.PretrainedError, OSError, ValueError, TypeError):
        return None  # the model's own loading reports what is wrong with it


def finetune_config(name: str, overrides: dict | None = None) -> TrainConfig:
    """A config that fine-tunes pretrained encoder ``name`` (``FINETUNE_DEFAULTS``, then ``overrides``)."""
    base = merge(merge(TrainConfig().to_dict(), FINETUNE_DEFAULTS), {"pretrained": {"name": name}})
    return TrainConfig.from_dict(merge(base, overrides or {}))


def _check(config: TrainConfig) -> None:
    if config.optim.embed_init not in ("svd", "model"):
        raise ConfigError(f"optim.embed_init must be 'svd' or 'model', got {config.optim.embed_init!r}")
    if config.optim.select not in ("accuracy", "loss"):
        raise ConfigError(f"optim.select must be 'accuracy' or 'loss', got {config.optim.select!r}")


def load_toml(path: str | Path) -> dict:
    """Read a TOML config file (sections ``[data]``, ``[model]``, ``[model.encoder]``, ``[optim]``, ``[run]``)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} " + ("is a folder" if path.is_dir() else "does not exist"))
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not valid TOML ({exc}); see docs/classification.md for an example"
        ) from None


def merge(base: dict, overrides: dict) -> dict:
    """Deep-merge ``overrides`` into ``base`` (both plain dicts)."""
    out = dict(base)
    for k, v in overrides.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
