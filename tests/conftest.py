import csv
import os
import random

import pytest
import torch

# The suite decodes with the lean step's BLAS product: measuring which kernel this machine streams weights fastest
# with (and compiling the other one) is tested on its own (tests/models/test_decode_kernels.py), not before each test.
os.environ.setdefault("MULTIHEAD_DECODE_KERNEL", "blas")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def make_sentiment_csv(path, n=600, seed=0):
    """A small learnable task: the label is which of two word lists dominates the text."""
    rng = random.Random(seed)
    pos, neg = ["good", "great", "fine", "lovely", "superb"], ["bad", "awful", "poor", "dull", "weak"]
    filler = ["the", "film", "was", "a", "plot", "actor", "scene", "and", "very", "quite", "story", "music"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "sentiment"])
        for i in range(n):
            label = i % 2
            words = rng.choices(filler, k=rng.randint(4, 14)) + rng.choices(pos if label else neg, k=2)
            rng.shuffle(words)
            w.writerow([" ".join(words) + f" {i}", "positive" if label else "negative"])
    return path


@pytest.fixture(scope="session")
def sentiment_csv(tmp_path_factory):
    return make_sentiment_csv(tmp_path_factory.mktemp("data") / "sentiment.csv")
