"""``python -m multihead``: the same as the ``multihead`` command."""

import sys

from .cli import main

sys.exit(main())
