"""``python -m multihead.cli``: the same as the ``multihead`` command."""

import sys

from . import main

sys.exit(main())
