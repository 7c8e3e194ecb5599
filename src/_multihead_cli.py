"""The ``multihead`` command's launcher, outside the package so that it runs before the package is imported.

Importing :mod:`multihead` loads PyTorch, which takes seconds; a Ctrl-C in those seconds would otherwise end in a
Python traceback. Here it ends as a Ctrl-C during a command does: one line and exit status 130. When the output is a
log rather than a terminal, progress bars are told (before tqdm is imported) to update every 30 seconds instead of
every step. Everything else is :func:`multihead.cli.main`.
"""

from __future__ import annotations

import sys


def main() -> int:
    if not sys.stderr.isatty():  # a log, not a terminal: a progress line every 30 s (read when tqdm is imported)
        import os

        os.environ.setdefault("TQDM_MININTERVAL", "30")
    try:
        from multihead.cli import main as run
    except KeyboardInterrupt:
        print("interrupted while starting; nothing was done", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
