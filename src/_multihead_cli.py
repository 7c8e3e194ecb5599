"""The ``multihead`` command's launcher, outside the package so that it runs before the package is imported.

Importing :mod:`multihead` loads PyTorch, which takes seconds; a Ctrl-C in those seconds would otherwise end in a
Python traceback. Here it ends as a Ctrl-C during a command does: one line and exit status 130. Everything else is
:func:`multihead.cli.main`.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from multihead.cli import main as run
    except KeyboardInterrupt:
        print("interrupted while starting; nothing was done", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
