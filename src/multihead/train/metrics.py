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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(labels)
    fig, ax = plt.subplots(figsize=(1.2 * k + 2.5, 1.2 * k + 2))
    ax.imshow(matrix, cmap="Blues")
    top = max(max(r) for r in matrix) or 1
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(matrix[i][j]), ha="center", va="center",
                    color="white" if matrix[i][j] > top / 2 else "black")
    ax.set_xticks(range(k), labels, rotation=45, ha="right")
    ax.set_yticks(range(k), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_curves(metrics_path: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
