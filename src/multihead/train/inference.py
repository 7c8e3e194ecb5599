"""Load a run folder and use it: predict texts, evaluate on a dataset. Nothing is unpickled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from .. import data as D
from ..models.classifier import TransformerClassifier
from .config import TrainConfig
from .runfolder import CheckpointError, check_shapes, header_shapes, load_checked, meta_shapes, read_json
from .evaluation import evaluate_ids, predict_ids


@dataclass
class Run:
    path: Path
    config: TrainConfig
    model: TransformerClassifier
    tokenizer: object
    labels: list[str]

    def encode(self, texts: list[str]) -> D.tokenizer.Encoded:
        return D.encode(self.tokenizer, texts, self.config.data.max_len)


def load_run(path: str | Path, device: str = "cpu") -> Run:
    """Rebuild the model from ``config.json`` and load ``model.safetensors`` (digest-checked)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"run folder {str(path)!r} does not exist; pass the --out folder of a training run")
    recorded = read_json(path / "config.json", dict)
    if not isinstance(recorded.get("train"), dict):
        raise CheckpointError(
            f"{path / 'config.json'} has no 'train' section: {path} is not a multihead run folder"
            + (
                " (it looks like an HF model folder: load it by its path as a pretrained model)"
                if "model_type" in recorded
                else ""
            )
        )
    try:
        config = TrainConfig.from_dict(recorded["train"])  # types, ranges and size ceilings
    except ValueError as exc:
        raise CheckpointError(f"{path / 'config.json'}: {exc}") from None
    labels = read_json(path / "labels.json", list)
    if not labels or not all(isinstance(x, str) for x in labels) or len(set(labels)) != len(labels):
        raise CheckpointError(
            f"{path / 'labels.json'} must be a list of distinct class names (strings), one per "
            "model output; it is corrupt"
        )
    if len(labels) != config.model.num_classes:
        raise CheckpointError(f"labels.json has {len(labels)} classes but the model has {config.model.num_classes}")
    check_shapes(
        meta_shapes(lambda: TransformerClassifier.from_config(config.model)),
        header_shapes(path / "model.safetensors"),
        path / "model.safetensors",
    )  # before allocating
    if not (path / "tokenizer.json").exists():
        raise CheckpointError(f"{path / 'tokenizer.json'} is missing; the run folder is incomplete")
    try:
        tokenizer = D.load_tokenizer(path / "tokenizer.json")
    except Exception as exc:  # the tokenizers library raises plain Exception for a malformed file
        raise CheckpointError(
            f"{path / 'tokenizer.json'} is not a readable tokenizer file "
            f"({str(exc).splitlines()[0][:200]}); it is corrupt"
        ) from None
    tensors, _ = load_checked(path / "model.safetensors")
    model = TransformerClassifier.from_config(config.model)
    try:
        model.load_state_dict(tensors)
    except RuntimeError as exc:
        raise CheckpointError(
            f"{path / 'model.safetensors'} does not fit the model in config.json: {str(exc).splitlines()[0]}"
        ) from None
    return Run(path, config, model.to(device).eval(), tokenizer, labels)


def predict(run: Run, texts: list[str]) -> list[dict]:
    """One dict per text: the predicted label and every class's probability."""
    enc = run.encode(texts)
    probs = predict_ids(run.model, enc.ids, next(run.model.parameters()).device)
    out = []
    for text, p in zip(texts, probs.tolist()):
        best = max(range(len(p)), key=p.__getitem__)
        out.append(
            {
                "text": text,
                "label": run.labels[best],
                "probabilities": {name: round(v, 6) for name, v in zip(run.labels, p)},
            }
        )
    return out


def examples(
    run: Run,
    data: str | None = None,
    *,
    splits: tuple[str, ...] = ("test",),
    text_column: str | None = None,
    label_column: str | None = None,
) -> tuple[str, dict]:
    """``(dataset name, {split: (token ids, label indices, texts truncated)})`` for ``splits`` (train/validation/
    test: the run's recorded split; all: every row) of ``data`` (default: the dataset the run was trained on),
    from one read of the data."""
    dc = run.config.data
    name = D.canonical_name(data) if data else dc.name
    ds = D.load(name, text_column=text_column or dc.text_column, label_column=label_column or dc.label_column)
    unknown = sorted(set(ds.labels) - set(run.labels))
    if unknown:
        raise D.DataError(
            f"labels {unknown} in {name!r} are not among the model's classes {run.labels}; evaluate on "
            "data with the same label set (or map the labels first)"
        )
    parts = {}
    recorded = None
    for one in splits:
        if one == "all":
            parts[one] = ds
        elif one in ("train", "validation", "test"):
            if name != D.canonical_name(dc.name):
                raise D.DataError(
                    f"{name!r} is not the dataset this run was trained on ({dc.name!r}), so it has "
                    "no recorded split; use --split all"
                )
            if recorded is None:
                recorded = dict(
                    zip(("train", "validation", "test"), D.apply_split(ds, read_json(run.path / "splits.json")))
                )
            parts[one] = recorded[one]
        else:
            raise D.DataError(f"unknown split {one!r}; choose train, validation, test or all")
    index = {n: i for i, n in enumerate(run.labels)}
    out = {}
    for one, part in parts.items():
        enc = run.encode(part.texts)
        out[one] = (enc.ids, [index[y] for y in part.labels], enc.truncated)
    return name, out


def evaluate(
    run: Run,
    data: str | None = None,
    *,
    split: str = "test",
    text_column: str | None = None,
    label_column: str | None = None,
) -> dict:
    """Accuracy, macro-F1 and confusion on ``split`` of ``data`` (see :func:`examples`)."""
    name, parts = examples(run, data, splits=(split,), text_column=text_column, label_column=label_column)
    ids, labels, truncated = parts[split]
    result = evaluate_ids(run.model, ids, labels, len(run.labels), next(run.model.parameters()).device)
    result.update(dataset=name, split=split, truncated=truncated, labels=run.labels)
    return result


__all__ = ["Run", "evaluate", "examples", "load_run", "predict"]
