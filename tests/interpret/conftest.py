"""Fixtures of the interpretation tests: ``browser``, a headless Chromium for the offline pages (browser.py)."""

from browser import browser  # noqa: F401
