"""The offline page: escaping, and a real headless Chromium (Debian's `chromium`, driven by Playwright)."""
import os
import shutil

import pytest
import torch

from multihead.interpret import AttentionMaps
from multihead.interpret.page import write_page

EVIL = ["[CLS]", "<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>", "a&amp;b", "<!--", "[SEP]"]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _maps(tokens, layers=2, heads=3):
    torch.manual_seed(0)
    n = len(tokens)
    return AttentionMaps("text <b>bold?</b>", tokens, [torch.softmax(torch.randn(heads, n, n), -1)
                                                      for _ in range(layers)], "test-model")


def test_page_is_self_contained_and_escapes_tokens(tmp_path):
    path = write_page(_maps(EVIL), tmp_path / "a.html", highlights={(1, 2): "<i>caption</i>"})
    html = path.read_text()
    assert "<img src=x" not in html and "</script><script>alert" not in html and "<i>caption" not in html
    assert html.count("<script") == 2 and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html  # no CDN, no network


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


def _open(browser, path):
    page = browser.new_page()
    problems = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("dialog", lambda d: (problems.append("dialog: " + d.message), d.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=20000)
    return page, problems


def test_page_in_chromium_head_and_model_views(browser, tmp_path):
    from multihead.interpret import load_subject
    from multihead.interpret import case_study

    maps = load_subject("minilm").maps(case_study.SENTENCE)
    path = write_page(maps, tmp_path / "attention.html",
                      highlights=case_study.highlights(case_study.run(maps)))
    page, problems = _open(browser, path)
    assert page.locator("#lines text").count() == 2 * 9  # tokens in two columns
    assert page.locator("#heads label").count() == 12
    assert page.locator("#lines line").count() > 0
    page.locator("#heads label[data-head='3']").click()  # toggling a head changes the lines drawn
    assert page.locator("#current").inner_text() == "layer 0, 11 heads"
    page.click("#tab-model")
    assert page.locator(".thumb").count() == 72
    page.locator(".thumb[data-layer='4'][data-head='9']").click()
    assert page.locator("#head-view").is_visible() and not page.locator("#model-view").is_visible()
    assert page.locator("#current").inner_text() == "layer 4, head 9"
    page.locator("#lines text").nth(2).hover()  # focus one query token: only its links remain
    assert page.locator("#lines text.focus").count() == 1
    shot = tmp_path / "head_view.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 5000
    assert problems == []


def test_hostile_tokens_show_as_text_in_chromium(browser, tmp_path):
    path = write_page(_maps(EVIL), tmp_path / "evil.html", highlights={(1, 2): "<i>caption</i>"})
    page, problems = _open(browser, path)
    texts = page.locator("#lines text").all_text_contents()  # SVG text has no innerText
    assert texts[:len(EVIL)] == EVIL  # shown literally
    assert page.locator("img").count() == 0 and page.locator("i").count() == 0
    assert page.locator("#text").inner_text() == "text <b>bold?</b>"
    page.click("#tab-model")
    assert page.locator(".thumb").count() == 6
    assert problems == []  # no alert dialog, no script error
