"""``data.limit`` has one meaning in every task: at most N items of each split, seeded, stratified by label where
labels exist, recorded in the run folder."""

from collections import Counter

import pytest
import torch
from hypothesis import given, settings, strategies as st

from multihead.data.limits import limit_indices


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=300), st.integers(0, 400), st.integers(0, 10))
def test_stratified_limit_keeps_each_class_share(labels, keep, seed):
    idx = limit_indices(len(labels), keep, seed, labels)
    n = len(labels)
    assert idx == sorted(set(idx)) and len(idx) == min(keep, n)
    got, have = Counter(labels[i] for i in idx), Counter(labels)
    for c, count in have.items():  # largest remainder: within one of the exact share
        assert abs(got[c] - min(keep, n) * count / n) < 1
    assert idx == limit_indices(len(labels), keep, seed, labels)  # seeded


def test_unlabelled_limit_is_a_seeded_sample_and_none_keeps_all():
    a, b = limit_indices(100, 10, 3), limit_indices(100, 10, 4)
    assert len(a) == 10 and a == sorted(a) and a != b and a == limit_indices(100, 10, 3)
    assert limit_indices(7, None, 0) == list(range(7)) == limit_indices(7, 50, 0)
    with pytest.raises(ValueError):
        limit_indices(10, -1, 0)


def test_image_runs_cut_every_split_the_same_way_and_record_it():
    from multihead.data import images as I

    splits = I.load_images("digits", seed=0).limit(50, 0, eval_keep=50)
    for part in (splits.train, splits.validation, splits.test):
        assert len(part[1]) == 50 and len(set(part[1].tolist())) == 10  # every digit kept
    assert splits.record["limit"] == {"train": 50, "evaluation": 50, "seed": 0, "stratified_by_label": True}
    again = I.load_images("digits", seed=0).limit(50, 0, eval_keep=50)
    assert torch.equal(again.train[0], splits.train[0])
