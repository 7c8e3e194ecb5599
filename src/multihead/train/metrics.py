"""Classification metrics and plots."""

from __future__ import annotations

from pathlib import Path

from ..plotting import save as save_figure


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
    save_figure(fig, path, formats=("png",), dpi=110)


def plot_curves(metrics_path: Path, path: Path) -> None:
    """The text classifier's curves: losses by step, accuracies by epoch (``path``: a .png)."""
    from ..plotting import Line, Panel, plot_curves as draw

    draw(
        metrics_path,
        path,
        (
            Panel(
                "step",
                (Line("loss", "train loss (last 50 steps)", "train", "-"), Line("val_loss", "validation loss")),
                "step",
                "loss",
            ),
            Panel(
                "epoch",
                (Line("val_accuracy", "validation"), Line("train_accuracy", "train (running)")),
                "epoch",
                "accuracy",
            ),
        ),
        formats=("png",),
    )
