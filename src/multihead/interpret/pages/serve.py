"""``multihead explain --serve``: the explain page on a local web server, where the reader types a text and the real
model recomputes every step.

The model is loaded once; each question then costs one forward pass (the determiner -> noun test that picks the
default head is run once, on the first question, and kept). The app is Starlette (a maintained, small ASGI framework
whose only dependency is anyio), served by uvicorn, bound to 127.0.0.1 only and answering only requests addressed to
``127.0.0.1`` or ``localhost`` (another site's page cannot reach it through DNS rebinding). A question is JSON
``{"text": ..., "layer": null | int}`` posted to ``/api/explain`` with ``Content-Type: application/json``, from the
server's own page: a request whose ``Origin`` (or ``Sec-Fetch-Site``) says another site sent it is refused (403)
before its body is read, and so is any other content type (415) -- the "simple" form and text posts a web page may
send anywhere without asking. Its size is checked from its header before it is read, the text's length and the
layer before the model runs, and a refusal is a 400 with the reason the page shows; a client that hangs up
mid-body is dropped quietly.

An answer is what the page's first screen needs (every head's q, k and v as float32 bytes, the tokens, the norms,
the next token's logits: a few hundred kilobytes at 400 tokens); the pictures of the other steps (the residual
stream, the MLP's hidden layer...) stay on the server, the last :data:`KEPT` answers' worth, and the page fetches
each from ``GET /api/strip?answer=ID&name=NAME`` when its step scrolls into view.
"""

from __future__ import annotations

import functools
import json
import secrets
import socket
import threading
import time
from collections import OrderedDict

from .explain import MAX_CHARS, STRIPS, explain, page_data, render_explain_page
from ..maps import Subject

MAX_BODY = 16 * 1024  # bytes: a question is a text of at most MAX_CHARS characters and a layer
HOSTS = ("127.0.0.1", "localhost")
KEPT = 4  # answers whose pictures the server keeps for the page to fetch (the page asks for its latest one's)


class Refused(ValueError):
    """A question the server answers with 400 and this message."""


def question(body: bytes) -> tuple[str, int | None]:
    """``(text, layer)`` of a posted question, or :class:`Refused` with what to send instead."""
    try:
        asked = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: arrays nested thousands deep
        raise Refused('send JSON: {"text": "...", "layer": null}') from None
    if not isinstance(asked, dict) or not isinstance(asked.get("text"), str):
        raise Refused('send JSON with a "text" string: {"text": "The cat sat on the mat.", "layer": null}')
    text, layer = asked["text"], asked.get("layer")
    if not text.strip():
        raise Refused("type some text to explain")
    if len(text) > MAX_CHARS:
        raise Refused(f"the text has {len(text)} characters; the page explains up to {MAX_CHARS}")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
        raise Refused(f'"layer" must be a layer number or null, got {layer!r}')
    return text, layer


def appended(body: bytes) -> int | None:
    """The token id a question asks to append to its text before explaining it (the page's generate loop: ``"next":
    id``), or None; :class:`Refused` where it is not a token id. Call after :func:`question` accepted the body."""
    nxt = json.loads(body).get("next")
    if nxt is not None and (isinstance(nxt, bool) or not isinstance(nxt, int) or nxt < 0):
        raise Refused(f'"next" must be a token id or null, got {nxt!r}')
    return nxt


class Explainer:
    """One model, kept loaded; :meth:`ask` answers one question at a time (the explain hooks share the model), and
    :meth:`answer` turns an answer into what the page reads first, keeping its pictures for :meth:`strip`."""

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self._lock = threading.Lock()  # the model: one question at a time
        self._kept = threading.Lock()  # the kept pictures: never waits on a question being computed
        self._strips: OrderedDict[str, dict] = OrderedDict()

    def ask(
        self, text: str, layer: int | None = None, head: int | None = None, *, append: int | None = None
    ) -> tuple[dict, float]:
        """:func:`~multihead.interpret.pages.explain.explain` of ``text`` (with token ``append``'s text after it: one
        step of the page's generate loop) and the seconds it took."""
        if append is not None:
            lm = getattr(self.subject, "lm", None)
            if lm is None:
                raise Refused(f"{self.subject.name} predicts no next token; only a causal LM's page generates")
            vocab = lm.model.config.vocab_size
            if not 0 <= append < vocab:
                raise Refused(f'"next": {append} is not a token of {self.subject.name} (ids 0 to {vocab - 1})')
            text += lm.token_texts([append])[0]
            if len(text) > MAX_CHARS:
                raise Refused(f"the text has reached {MAX_CHARS} characters, the most the page explains")
        with self._lock:
            start = time.perf_counter()
            data = explain(self.subject, text, layer=layer, head=head)
            return data, time.perf_counter() - start

    def answer(self, data: dict) -> dict:
        """What the page reads first of ``data`` (:func:`~multihead.interpret.pages.explain.page_data`), with the
        id under which its pictures are kept (the last :data:`KEPT` answers')."""
        core, strips = page_data(data)
        core["answer"] = secrets.token_hex(8)
        with self._kept:
            self._strips[core["answer"]] = strips
            while len(self._strips) > KEPT:
                self._strips.popitem(last=False)
        return core

    def strip(self, answer: str, name: str) -> dict | None:
        """The picture ``name`` of a kept answer (packed; None where the model has no such step), or
        :class:`Refused` where the name is not a picture or the answer is no longer kept."""
        if name not in STRIPS:
            raise Refused(f"no picture {name!r}; the pictures are {', '.join(STRIPS)}")
        with self._kept:
            strips = self._strips.get(answer)
        if strips is None:
            raise Refused("this answer is no longer kept on the server; explain the text again")
        return strips[name]


def cross_site(headers) -> str | None:
    """Why a request's headers say another site's page sent it (None when they do not): its ``Origin`` is not the
    address it was sent to (``http://`` + its ``Host``), or the browser's ``Sec-Fetch-Site`` says ``cross-site`` or
    ``same-site``. Requests without either header come from a program on this machine, not a web page."""
    origin = headers.get("origin")
    if origin is not None and origin != f"http://{headers.get('host', '')}":
        return f"a page from {origin} may not ask this server; open the page the server serves"
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return "a page from another site may not ask this server; open the page the server serves"
    return None


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` header says JSON (``application/json``, any parameters after it)."""
    return (content_type or "").split(";")[0].strip().lower() == "application/json"


def app(explainer: Explainer, first: str | dict):
    """The Starlette app: ``GET /`` the page (``first``: a text to explain on the first visit, or what
    :meth:`Explainer.ask` already answered for it), ``POST /api/explain`` a question, ``GET /api/strip`` one picture
    of a kept answer."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import ClientDisconnect
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    page: dict[str, str] = {}

    async def index(request):
        if "html" not in page:  # rendered once; a first text not yet explained is explained now
            data = first if isinstance(first, dict) else (await run_in_threadpool(explainer.ask, first))[0]
            kept = (await run_in_threadpool(explainer.answer, data))["answer"]
            page["html"] = render_explain_page(data, serve=True, strips=kept)
        return HTMLResponse(page["html"], headers={"cache-control": "no-store"})

    async def strip(request):
        why = cross_site(request.headers)
        if why is not None:
            return JSONResponse({"error": why}, status_code=403)
        try:
            picture = explainer.strip(request.query_params.get("answer", ""), request.query_params.get("name", ""))
        except Refused as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        return JSONResponse({"strip": picture}, headers={"cache-control": "no-store"})

    async def answer(request):
        why = cross_site(request.headers)
        if why is not None:
            return JSONResponse({"error": why}, status_code=403)
        if not is_json(request.headers.get("content-type")):
            return JSONResponse({"error": "send the question as Content-Type: application/json"}, status_code=415)
        size = request.headers.get("content-length")
        if size is None or not size.isdigit() or int(size) > MAX_BODY:
            return JSONResponse({"error": f"send a JSON question of at most {MAX_BODY} bytes"}, status_code=413)
        body = b""
        try:
            async for chunk in request.stream():  # the header may lie: stop at the limit
                body += chunk
                if len(body) > MAX_BODY:
                    return JSONResponse({"error": f"send a JSON question of at most {MAX_BODY} bytes"}, status_code=413)
        except ClientDisconnect:  # the client hung up before its body came: nobody is left to answer
            return Response(status_code=400)
        try:
            text, layer = question(body)
            data, seconds = await run_in_threadpool(
                functools.partial(explainer.ask, text, layer, append=appended(body))
            )
        except ValueError as e:  # Refused, or explain's own refusals (a layer out of range, an unusual layer)
            return JSONResponse({"error": str(e)}, status_code=400)
        core = await run_in_threadpool(explainer.answer, data)  # packing megabytes: off the event loop
        return JSONResponse({"data": core, "seconds": seconds})

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/explain", answer, methods=["POST"]),
            Route("/api/strip", strip, methods=["GET"]),
        ],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(HOSTS))],
    )


def bind(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (``port`` 0: any free one); refused with the fix where the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        raise ValueError(
            f"port {port} on 127.0.0.1 is taken ({e.strerror}); pass another --port, or 0 for any"
        ) from None
    sock.listen(64)
    return sock


class Server:
    """uvicorn serving :func:`app` on a socket from :func:`bind` (``sock``, or one bound to ``port``); ``first``:
    the first page's text, or :meth:`Explainer.ask`'s answer for it. :meth:`run` blocks, :meth:`start` runs it in a
    thread (tests, notebooks) and :meth:`stop` ends it."""

    def __init__(
        self, explainer: Explainer, text: str, port: int = 0, *, sock: socket.socket | None = None, first=None
    ) -> None:
        import uvicorn

        self.sock = sock if sock is not None else bind(port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        config = uvicorn.Config(app(explainer, text if first is None else first), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        self._server.run(sockets=[self.sock])

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.sock.close()


__all__ = [
    "Explainer",
    "HOSTS",
    "KEPT",
    "MAX_BODY",
    "Refused",
    "Server",
    "app",
    "appended",
    "bind",
    "cross_site",
    "is_json",
    "question",
]
