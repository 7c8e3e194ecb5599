"""``multihead bench page``: what the served explain page costs the reader's browser.

MiniLM-L6 (the bundled package) behind ``multihead explain --serve``'s server, a real Chromium (the system's, driven by
Playwright) typing texts of ``--lengths`` tokens (default 50 and 400; the text box holds at most 2,000 characters,
about 400 of MiniLM's tokens). For each text:

* ``answer_bytes`` -- the size of the server's answer to "explain";
* ``server_s`` -- the seconds the model took (the server's own count);
* ``interactive_s`` -- from the click to a page whose script has drawn the first screen and whose main thread is
  free again (a timer set after that fires): time to interactive;
* ``strips_bytes`` / ``all_drawn_s`` -- scrolling to the bottom step by step: the pictures fetched as their steps come
  into view, and the time until every one is drawn;
* ``dom_cells`` -- table cells on the page (a table of L x L cells is what froze the tab).

The peer measured in the same run is ``file``: the page written to a file for the same text (every number inline,
as ``multihead explain --out`` writes it), opened in the same browser, from navigation to interactive. Ratios are
served against file. Each case runs in this process (one browser, one loaded model); the JSON is written as it goes.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .harness import machine_info, write_json

WORDS = (
    "Attention lets every token look at every other token in the sentence and decide how much of each one it "
    "needs: the query of one word is compared with the keys of all words, the scores become weights, and the "
    "weights average the values into what the word carries to the next layer of the model."
).split()


def text_of(subject, tokens: int) -> str:
    """An English text of exactly ``tokens`` tokens in ``subject``'s tokenizer (special tokens included), where the
    words allow; the closest below otherwise."""
    words: list[str] = []
    best = ""
    while True:
        words.append(WORDS[len(words) % len(WORDS)])
        text = " ".join(words)
        _, keep = subject.encode([text])
        if int(keep[0].sum()) > tokens:
            return best
        best = text


# the milliseconds from window.__t1 until every picture of a shown step is drawn (a page that draws them all at once,
# without `later`, is drawn when it is interactive: 0). A step the scroll passed between two frames (a loaded
# machine paints less often than every 30 ms) was never seen by the page's IntersectionObserver: it is brought into
# view again, as a reader scrolling back would.
DRAWN = """() => new Promise((done) => {
  const left = () => [...document.querySelectorAll('canvas.strip')]
    .filter((c) => c.id !== 'lengths' && !c.closest('[hidden]') && !c.dataset.drawn);
  const wait = () => {
    const rest = typeof later === 'function' ? left() : [];
    if (!rest.length) return done(performance.now() - window.__t1);
    if (performance.now() - window.__t1 > 120000) return done(null);
    rest[0].scrollIntoView({ block: 'center' });
    setTimeout(wait, 50);
  };
  wait();
})"""


def measure(page, text: str) -> dict:
    """One served case: type ``text`` into the served page ``page`` (already open), click "explain", and read the costs."""
    responses: list = []  # read after the case: a body read inside the browser's event handler would deadlock

    def seen(response) -> None:
        if "/api/" in response.url:
            responses.append(response)

    page.on("response", seen)
    try:
        page.evaluate("window.scrollTo(0, 0)")
        page.locator("#input").fill(text)
        page.evaluate("() => { window.__t0 = performance.now(); document.getElementById('go').click(); }")
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('computed') && document.body.dataset.ready === '1'",
            timeout=600_000,
            polling=10,
        )
        interactive = page.evaluate("() => new Promise((r) => setTimeout(() => r(performance.now() - window.__t0), 0))")
        status = page.locator("#status").inner_text()
        server = float(status.split(" in ")[1].split(" s")[0])
        page.evaluate("() => { window.__t1 = performance.now(); }")
        y = 0
        while y < page.evaluate("document.body.scrollHeight"):  # as a reader scrolls: each step's pictures come in
            page.evaluate(f"window.scrollTo(0, {y})")  # view (and the page grows as they are drawn)
            page.wait_for_timeout(30)
            y += 600
        drawn = page.evaluate(DRAWN)
        cells = page.evaluate("document.querySelectorAll('td').length")
    finally:
        page.remove_listener("response", seen)
    sizes: dict[str, int] = {"explain": 0, "strip": 0}
    for response in responses:
        for kind in sizes:
            if f"/api/{kind}" in response.url:
                size = response.headers.get("content-length")  # the browser keeps no body of tens of MB
                sizes[kind] += int(size) if size is not None else len(response.body())
    return {
        "answer_bytes": sizes["explain"],
        "server_s": server,
        "interactive_s": interactive / 1000,
        "page_s": interactive / 1000 - server,  # the browser's share: receiving, decoding and drawing
        "strips_bytes": sizes["strip"],
        "all_drawn_s": None if drawn is None else drawn / 1000,  # None: a picture was still missing after 2 min
        "dom_cells": cells,
    }


def measure_file(browser, subject, text: str) -> dict:
    """The peer: the same text's page written to a file (every number inline), from navigation to interactive."""
    from ..interpret.pages.explain import explain, write_explain_page

    with tempfile.TemporaryDirectory() as tmp:
        path = write_explain_page(explain(subject, text), Path(tmp) / "explain.html")
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            start = time.perf_counter()
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=600_000)
            page.evaluate("() => new Promise((r) => setTimeout(r, 0))")
            seconds = time.perf_counter() - start
            cells = page.evaluate("document.querySelectorAll('td').length")
        finally:
            page.close()
        return {"file_bytes": path.stat().st_size, "interactive_s": seconds, "dom_cells": cells}


def run(*, lengths=None, out: Path | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm

    from ..interpret import load_subject
    from ..interpret.pages.serve import Explainer, Server

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise ValueError("bench page drives Chromium through Playwright: pip install -e '.[dev]'") from None
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise ValueError("bench page needs Chromium: install Debian's `chromium` package (apt-get install chromium)")
    subject = load_subject("minilm")
    results: list[dict] = []
    payload = {
        "suite": "page",
        "config": {"model": "minilm", "browser": "chromium (headless, Playwright)", "viewport": [1280, 900]},
        "machine": machine_info(None),
        "results": results,
    }
    server = Server(Explainer(subject), "The cat sat on the mat.").start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            payload["config"]["browser_version"] = browser.version
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url)
            page.wait_for_selector("body[data-ready='1']", timeout=600_000)
            for tokens in tqdm(lengths or [50, 400], desc="bench page", disable=not progress):
                text = text_of(subject, tokens)
                n = int(subject.encode([text])[1][0].sum())
                served = {"impl": "served", "tokens": n, "chars": len(text), **measure(page, text)}
                peer = {"impl": "file", "tokens": n, "chars": len(text), **measure_file(browser, subject, text)}
                served["interactive_vs_file"] = served["interactive_s"] / peer["interactive_s"]
                served["page_vs_file"] = served["page_s"] / peer["interactive_s"]
                served["bytes_vs_file"] = served["answer_bytes"] / peer["file_bytes"]
                results += [served, peer]
                if out is not None:
                    write_json(out, payload)
            browser.close()
    finally:
        server.stop()
    return payload


def format_table(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        f"{m.get('cpu', m.get('machine'))}; {payload['config'].get('browser_version', 'chromium')}; MiniLM-L6; "
        "ratio: the served page's own time (interactive - server) against the written file's, in this run",
        f"{'tokens':>6} {'impl':<7}{'bytes':>12}{'interactive s':>15}{'server s':>10}{'page s':>8}{'pictures':>12}"
        f"{'cells':>7}{'ratio':>7}",
    ]
    for r in payload["results"]:
        size = r.get("answer_bytes", r.get("file_bytes"))
        lines.append(
            f"{r['tokens']:>6} {r['impl']:<7}{size:>12,}{r['interactive_s']:>15.3f}"
            f"{r.get('server_s', float('nan')):>10.3f}{r.get('page_s', r['interactive_s']):>8.3f}"
            f"{r.get('strips_bytes', 0):>12,}{r['dom_cells']:>7}"
            f"{(format(r['page_vs_file'], '.3f') if 'page_vs_file' in r else '-'):>7}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"page-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench page`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(lengths=args.lengths, out=out)


__all__ = ["format_table", "from_args", "measure", "measure_file", "run", "text_of"]
