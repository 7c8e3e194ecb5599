"""TF-IDF + logistic regression on the same split: tells whether attention earned its keep."""

from __future__ import annotations

import time


def tfidf_baseline(splits, Cs=(0.25, 1.0, 4.0, 16.0)) -> dict:
    """Word 1-2-gram TF-IDF + logistic regression; C chosen on the validation split, scored on test."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    xtr = vec.fit_transform(splits.train.texts)
    xva, xte = vec.transform(splits.validation.texts), vec.transform(splits.test.texts)
    best = None
    for c in Cs:
        clf = LogisticRegression(C=c, max_iter=2000)
        clf.fit(xtr, splits.train.labels)
        acc = sum(p == y for p, y in zip(clf.predict(xva), splits.validation.labels)) / len(splits.validation)
        if best is None or acc > best[0]:
            best = (acc, c, clf)
    acc_val, c, clf = best
    test_acc = sum(p == y for p, y in zip(clf.predict(xte), splits.test.labels)) / len(splits.test)
    return {"test_accuracy": test_acc, "validation_accuracy": acc_val, "C": c, "seconds": time.perf_counter() - t0}
