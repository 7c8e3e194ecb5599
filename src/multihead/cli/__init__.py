"""The ``multihead`` command: one module per group of subcommands, each declaring its parser beside its handler
(``register(sub)``); :func:`main` maps bad input to ``error: ...`` and exit 2 in one place.

    args.py      argument types and helpers          tools.py    demo, backends, bench
    training.py  train, pretrain, compare, sweep      runs.py     evaluate, predict, data, embed, export
    inspect.py   show, heads, importance, prune       lm.py       generate, sinks, induction
    interventions.py  patch, attribute, circuit       speech.py   transcribe
    findings.py  findings

A new subcommand: a ``cmd_*`` handler and its ``sub.add_parser(...)`` lines in the module of its group (numbers
validated at parse time with the types in ``args.py``), calling one library function. Nothing below the CLI imports
it (import-linter's layers contract).
"""

from __future__ import annotations

import argparse
import sys

from . import findings, inspect, interventions, lm, runs, speech, tools, training
from .args import Route
from .training import train_config_from_args, train_overrides  # noqa: F401  (used by tests and scripts)

GROUPS = (tools, training, runs, inspect, lm, findings, interventions, speech)


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching (``--dat`` is not taken for ``--data``: a misspelt flag is refused, not
    guessed) and with a suggestion for a near-miss flag."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def unknown(self, extra: list[str]) -> None:
        """Refuse ``extra`` (arguments no option takes) with this parser's usage and the flags meant."""
        import difflib

        flags = [o for a in self._actions for o in a.option_strings]
        meant = [
            f"{close[0]} for {e.split('=')[0]}"
            for e in extra
            if e.startswith("-") and (close := difflib.get_close_matches(e.split("=")[0], flags, n=1))
        ]
        self.error(
            f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {', '.join(meant)}?)" if meant else "")
        )


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    p = Parser(prog="multihead", description="Multi-head attention: train, inspect, prune, run fast.")
    p.add_argument("--version", action="version", version=f"multihead {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.register(sub)
    return p


BUG_REPORT = "the project's issue tracker"


def _check_argv(argv: list[str]) -> None:
    """Arguments arrive as text; bytes that are not UTF-8 (decoded by Python as surrogates) would fail deep inside a
    tokenizer or a file name, so they are refused here with their position."""
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise ValueError(
                f"argument {i} ({shown!r}) is not valid UTF-8 text; pass UTF-8 (e.g. convert it with iconv -t UTF-8)"
            ) from None


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad input ends with ``error: ...`` on stderr and exit status 2, never a traceback; a bug
    ends with ``internal error`` and exit 70 (``MULTIHEAD_DEBUG=1`` shows the traceback)."""
    import os

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        _check_argv(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # refused by the subcommand's own parser: its usage, and the flag meant
        parser._subparsers._group_actions[0].choices[args.command].unknown(extra)  # type: ignore[union-attr]
    try:
        code = args.fn(args)
        if isinstance(code, Route):  # the source decides who serves the verb: the verb x source table says
            from .verbs import dispatch

            code = dispatch(code, args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at interpreter exit
        return code
    except BrokenPipeError:  # the reader went away (`multihead backends | head`): stop quietly, as shell tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as exc:  # training says what it saved and how to resume (RunInterrupted)
        print(str(exc) or "interrupted; files written so far are complete (every write is atomic)", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, _user_errors()):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, OSError):  # permissions, a full disk, a folder where a file was expected
            where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
            print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
            return 2
        if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _out_of_memory(exc)):
            print(f"error: {_memory_message(exc)}", file=sys.stderr)
            return 2
        return _internal(exc)  # a bug, not bad input: say so, without a traceback unless asked


# Bad input, answered with its message and exit 2: these classes, where their module has been imported (an
# exception of a module never imported cannot have been raised; importing them up front would load torch before
# every command's first line).
USER_ERRORS = {
    "multihead._io": "FolderError",
    "multihead._weights": "CheckpointError",
    "multihead.train.runfolder": "RunExistsError",
    "multihead.data.datasets": "DataError",
    "multihead.pretrained.errors": "PretrainedError",
}


def _user_errors() -> tuple[type[BaseException], ...]:
    loaded = [getattr(sys.modules[m], n) for m, n in USER_ERRORS.items() if m in sys.modules]
    return (*loaded, FileNotFoundError, ValueError)


def _internal(exc: BaseException) -> int:
    import os

    if os.environ.get("MULTIHEAD_DEBUG"):
        raise exc
    print(
        f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}\n"
        f"This is a bug in multihead, not in your input. Please report it at {BUG_REPORT} with the command you "
        "ran (MULTIHEAD_DEBUG=1 shows the traceback).",
        file=sys.stderr,
    )
    return 70


_OOM = ("cannot allocate memory", "can't allocate memory", "not enough memory", "out of memory", "unable to mmap")


def _out_of_memory(exc: BaseException) -> bool:
    """PyTorch reports a failed allocation or mapping as a RuntimeError; these words say it was memory."""
    text = str(exc).lower()
    return any(w in text for w in _OOM)


def _memory_message(exc: BaseException) -> str:
    """What ran out, and the limit this process runs under (an address-space cap is the usual cause)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limit = (
        f"this process may map at most {soft / 2**30:.1f} GiB (an address-space limit: ulimit -v); PyTorch alone "
        "reserves several GiB of address space, so raise the limit (ulimit -v unlimited)"
        if soft != resource.RLIM_INFINITY
        else "free memory, or use a smaller model, batch or --max-len"
    )
    detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return f"out of memory ({detail}); {limit}"


__all__ = ["build_parser", "main", "train_config_from_args", "train_overrides"]
