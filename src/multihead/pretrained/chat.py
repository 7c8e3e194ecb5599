"""Chat templates, rendered with bounded time, memory and output.

A chat template is a jinja2 program that comes with the model file. HF transformers renders it in jinja2's sandbox,
which stops attribute tricks (``''.__class__.__mro__``) but not a loop of 10^10 steps, a string multiplied by 10^10
or a macro that calls itself: any of these hangs or exhausts the machine's memory. Here the sandbox runs in a child
process (the same Python, ``-I``: no user site, no environment variables) that has a CPU-time and an address-space
limit, is killed after :data:`SECONDS` of wall-clock time, and stops once its output passes :data:`output_limit`.
Every failure comes back as a :class:`~multihead.pretrained.errors.LMError` that names the file the template came
from, what it did, and the fix. The child costs about a tenth of a second per prompt.

The template sees what HF gives it: ``messages``, ``add_generation_prompt``, the special tokens' strings
(``bos_token``, ``eos_token``, ``pad_token``), ``raise_exception(message)`` and ``strftime_now(format)``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from .errors import LMError

SECONDS = 10  # wall clock for one render
MEMORY = 1 << 30  # the child's address space (bytes)

_CHILD = r"""
import json, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (SECONDS, SECONDS + 1))
except (ImportError, ValueError, OSError):
    pass
import datetime
from jinja2 import TemplateNotFound, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

job = json.loads(sys.stdin.read())
limit = job["limit"]


class Refused(Exception):
    pass


class TooLarge(Exception):
    pass


def bounded(value, what):
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > limit:
        raise TooLarge(what)
    return value


class Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+"])

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            n = right if isinstance(right, int) else left if isinstance(left, int) else None
            other = left if n is right else right
            if n is not None and isinstance(other, (str, bytes, list, tuple)) and len(other) * max(n, 0) > limit:
                raise TooLarge("a string or list multiplied past the output limit")
        if operator == "**" and isinstance(right, int) and right > 1024:
            raise TooLarge("a power with an exponent over 1024")
        return bounded(super().call_binop(context, operator, left, right), "a sum past the output limit")


def raise_exception(message):
    raise Refused(str(message))


def out(kind, detail=""):
    sys.stdout.write(json.dumps({"kind": kind, "detail": str(detail)[:300]}))


try:
    env = Env(trim_blocks=True, lstrip_blocks=True)
    env.globals.pop("lipsum", None)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(str(fmt))
    template = env.from_string(job["template"])
    size, parts = 0, []
    for chunk in template.generate(**job["context"]):
        size += len(chunk)
        if size > limit:
            raise TooLarge("output past the limit")
        parts.append(chunk)
    sys.stdout.write(json.dumps({"kind": "ok", "text": "".join(parts)}))
except TemplateSyntaxError as exc:
    out("syntax", f"line {exc.lineno}: {exc.message}")
except SecurityError as exc:
    out("unsafe", exc)
except UndefinedError as exc:
    out("undefined", exc)
except TemplateNotFound as exc:
    out("include", exc)
except Refused as exc:
    out("refused", exc)
except TooLarge as exc:
    out("output", exc)
except RecursionError:
    out("recursion")
except MemoryError:
    out("memory")
except OverflowError as exc:
    out("range", exc)
except TypeError as exc:
    out("include" if "loader" in str(exc) else "error", exc)
except Exception as exc:
    out("error", f"{type(exc).__name__}: {exc}")
"""

_WHAT = {
    "syntax": "is not valid jinja2 ({detail})",
    "unsafe": "tried something the sandbox forbids ({detail})",
    "undefined": "uses a name it was not given ({detail})",
    "include": "includes or imports another template, which a chat template cannot do ({detail})",
    "refused": "refused the messages: {detail}",
    "output": "produced more text than a prompt can hold ({detail})",
    "recursion": "recursed without end",
    "memory": "needed more memory than a prompt can take",
    "range": "asked for a range too large to loop over ({detail})",
    "time": "ran for over {seconds} seconds",
    "error": "failed ({detail})",
}


# The limits a runaway template meets; one that grows without end may meet any of them first (a busy machine
# reaches the time limit before the memory limit), so every such refusal also says LIMIT_HIT.
LIMITS = frozenset({"output", "recursion", "memory", "range", "time"})
LIMIT_HIT = "went past a limit of a chat template"


def output_limit(messages: list[dict]) -> int:
    """The most text a render may produce: twice the messages' own text plus 64 KiB of markup."""
    text = sum(len(str(m.get("content", ""))) + len(str(m.get("role", ""))) for m in messages)
    return 2 * text + (64 << 10)


def render(template: str, source: str, messages: list[dict], *, add_generation_prompt: bool, special: dict) -> str:
    """The prompt text of ``messages`` through ``template`` (which came from ``source``, named in every error)."""
    if not isinstance(template, str):
        raise LMError(f"the chat template in {source} is a {type(template).__name__}, not text; remove it or fix it")
    job = {
        "template": template,
        "limit": output_limit(messages),
        "context": {"messages": messages, "add_generation_prompt": add_generation_prompt, **special},
    }
    code = _CHILD.replace("MEMORY", str(MEMORY)).replace("SECONDS", str(SECONDS))
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", code], input=json.dumps(job), capture_output=True, text=True, timeout=SECONDS
        )
    except subprocess.TimeoutExpired:
        found = {"kind": "time"}
    else:
        if proc.returncode in (-getattr(signal, "SIGXCPU", 24), -signal.SIGKILL):  # the CPU-time limit
            found = {"kind": "time"}
        else:
            try:
                found = json.loads(proc.stdout)
            except ValueError:  # died before it could answer: out of memory while printing, or worse
                found = {"kind": "memory" if "MemoryError" in proc.stderr else "error", "detail": proc.stderr[-200:]}
    if found["kind"] == "ok":
        return found["text"]
    what = _WHAT[found["kind"]].format(detail=found.get("detail", ""), seconds=SECONDS)
    if found["kind"] in LIMITS:  # which limit a runaway template meets first depends on the machine's load
        what = f"{LIMIT_HIT}: it {what}"
    raise LMError(
        f"the chat template in {source} {what}; pass the prompt as plain text (without --chat), or fix the template "
        "in that file"
    )


__all__ = ["LIMIT_HIT", "LIMITS", "MEMORY", "SECONDS", "output_limit", "render"]
