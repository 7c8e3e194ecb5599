"""A real headless Chromium (Debian's `chromium`, driven by Playwright) for the tests of the offline pages."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip("no Chromium: install Debian's `chromium` package (apt-get install chromium); .ci/run does")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, path, viewport: dict | None = None, timeout: int = 20000):
    """``(page, problems)``: the page at ``path`` (a file, or a URL string) once its script says it is ready;
    console errors, page errors and dialogs (a script that should never run) collected in ``problems``."""
    page = browser.new_page(**({"viewport": viewport} if viewport else {}))
    problems = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("dialog", lambda d: (problems.append("dialog: " + d.message), d.dismiss()))
    page.goto(path if isinstance(path, str) else path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=timeout)
    return page, problems
