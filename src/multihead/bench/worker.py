"""``python -m multihead.bench.worker SPEC_JSON``: measure one case in this fresh process, print JSON."""

import json
import sys

from .harness import run_worker

if __name__ == "__main__":
    print(json.dumps(run_worker(json.loads(sys.argv[1]))))
