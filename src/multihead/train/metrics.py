"""Classification metrics and plots."""

from __future__ import annotations

from .._io import atomic_save_figure

import json
from pathlib import Path


def confusion_matrix(y_true: list[int], y_pred: list[int], num_classes: int) -> list[list[int]]:
    """``m[true][pred]`` counts."""
    m = [[0] * num_classes for _ in range(num_classes)]
    for t, p in zip(y_true, y_pred):
        m[t][p] += 1
    return m


def scores(y_true: list[int], y_pred: list[int], num_classes: int) -> dict:
    m = confusion_matrix(y_true, y_pred, num_classes)
    n = len(y_true)
    acc = sum(m[i][i] for i in range(num_classes)) / n if n else 0.0
    f1s = []
    for c in range(num_classes):
        tp = m[c][c]
        fp = sum(m[r][c] for r in range(num_classes)) - tp
        fn = sum(m[c]) - tp
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return {"accuracy": acc, "macro_f1": sum(f1s) / num_classes, "per_class_f1": f1s, "confusion": m, "n": n}


def plot_confusion(matrix: list[list[int]], labels: list[str], path: Path, title: str) -> None:
    from ..plotting import pyplot

    plt = pyplot()

    from ..plotting import plain

    k = len(labels)
    # The figure grows with the class count only up to 16 inches: 100 classes once took 60 s and 6.7 GB.
    size = min(16.0, 1.2 * k + 2.5) if k <= 12 else min(16.0, 0.35 * k + 4)
    fig, ax = plt.subplots(figsize=(size, size - 0.5))
    ax.imshow(matrix, cmap="Blues", interpolation="nearest")
    top = max(max(r) for r in matrix) or 1
    if k <= 20:  # counts in the cells while they are readable
        for i in range(k):
            for j in range(k):
                ax.text(
                    j,
                    i,
                    str(matrix[i][j]),
                    ha="center",
                    va="center",
                    color="white" if matrix[i][j] > top / 2 else "black",
                )
    step = max(1, -(-k // 40))  # at most 40 labelled ticks per axis
    ticks = list(range(0, k, step))
    names = [plain(labels[i][:24]) for i in ticks]
    ax.set_xticks(
        ticks, names, rotation=45 if k <= 12 else 90, ha="right" if k <= 12 else "center", fontsize=10 if k <= 12 else 6
    )
    ax.set_yticks(ticks, names, fontsize=10 if k <= 12 else 6)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(plain(title))
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_curves(metrics_path: Path, path: Path) -> None:
    from ..plotting import pyplot

    plt = pyplot()

    events = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    steps = [e for e in events if e.get("event") == "train"]
    evals = [e for e in events if e.get("event") == "eval"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    if steps:
        a.plot([e["step"] for e in steps], [e["loss"] for e in steps], label="train loss (last 50 steps)")
    if evals:
        a.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], marker="o", label="validation loss")
        b.plot([e["epoch"] for e in evals], [e["val_accuracy"] for e in evals], marker="o", label="validation")
        b.plot([e["epoch"] for e in evals], [e["train_accuracy"] for e in evals], marker="o", label="train (running)")
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.legend()
    b.set_xlabel("epoch")
    b.set_ylabel("accuracy")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    plt.close(fig)
