"""One split type for every task: the classifier's texts, the images of the ViT and grounding, G2P's lexicons and
pretraining's texts are all :class:`Splits`, and ``limit`` means one thing on each (at most N per part, seeded,
stratified by label where there are labels, recorded)."""

from collections import Counter

import pytest

from multihead import data as D
from multihead.data import g2p as G
from multihead.data import images as I
from multihead.data.packing import apply_text_split, split_texts
from multihead.data.splits import Splits


def _every_task_split():
    texts = D.split(D.load("rotten_tomatoes"), seed=0)
    digits = I.load_images("digits", seed=0)
    lex = G.load_cmudict()
    words = G.apply_split(lex, G.split_words(lex, seed=0))
    corpus = [f"text {i}" for i in range(50)]
    pre = apply_text_split(corpus, split_texts(50, validation=0.2, seed=0))
    return {"classifier": texts, "images": digits, "g2p": words, "pretrain": pre}


def test_every_task_splits_into_the_one_type():
    splits = _every_task_split()
    assert all(type(s) is Splits for s in splits.values())
    assert [n for n, _ in splits["pretrain"].items()] == ["train", "validation"]  # no test part
    with pytest.raises(KeyError, match="no 'test' part"):
        splits["pretrain"]["test"]
    assert splits["g2p"]["test"] is splits["g2p"].test and splits["images"].label_names == [str(i) for i in range(10)]
    assert splits["pretrain"].sizes() == {"train": 40, "validation": 10}


@pytest.mark.parametrize("task", ["classifier", "images", "g2p"])
def test_limit_means_one_thing_on_every_part_kind(task):
    full = _every_task_split()[task]
    cut = full.limit(30, seed=3, eval_keep=20)
    assert len(cut.train) == min(30, len(full.train))
    assert len(cut.validation) == min(20, len(full.validation)) and len(cut.test) == min(20, len(full.test))
    labelled = task != "g2p"
    assert cut.record["limit"] == {"train": 30, "evaluation": 20, "seed": 3, "stratified_by_label": labelled}
    assert full.limit(30, seed=3, eval_keep=20).sizes() == cut.sizes()  # seeded
    train_only = full.limit(30, seed=3)  # validation and test stay whole unless asked
    assert train_only.sizes() == {**full.sizes(), "train": min(30, len(full.train))}
    assert train_only.validation is full.validation and train_only.test is full.test
    if labelled:  # each class keeps its share of the 30, within one item
        whole, part = Counter(full.train.label_ids()), Counter(cut.train.label_ids())
        for c, n in whole.items():
            assert abs(part[c] - 30 * n / len(full.train)) < 1
    assert full.limit(None, seed=3) is full
