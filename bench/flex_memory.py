"""Peak memory of one FlexAttention call on CPU at 16k tokens with a 64-token sliding window: multihead's ``flex``
backend (its block mask from the pattern's geometry, the shape verified once against the formula) against PyTorch's
own compiled ``flex_attention`` with its own ``create_block_mask``. Each side runs in a fresh process; the figure is
its peak resident memory (``VmHWM``) minus what the process held before the call.

    python bench/flex_memory.py [--length 16384] [--window 64]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, torch
length, window, which = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, length, 64) for _ in range(3))
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
base = hwm()
with torch.no_grad():
    if which == "multihead":
        import multihead as mh
        from multihead.attention.patterns import SparsePattern
        out, _ = mh.attention(q, k, v, mask=SparsePattern(window=window), backend="flex")
    else:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        rule = lambda b, h, i, j: (i - j).abs() <= window
        bm = create_block_mask(rule, 1, 1, length, length, device="cpu", _compile=True)  # no dense L x L
        out = torch.compile(flex_attention)(q, k, v, block_mask=bm)
print(json.dumps({"which": which, "peak_bytes": hwm() - base, "finite": bool(torch.isfinite(out).all())}))
"""


def measure(which: str, length: int, window: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(length), str(window), which], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--window", type=int, default=64)
    args = ap.parse_args()
    rows = [measure(w, args.length, args.window) for w in ("torch", "multihead")]
    for r in rows:
        print(f"{r['which']:10s} peak {r['peak_bytes'] / 2**30:.3f} GiB  finite={r['finite']}")
    print(f"multihead / torch: {rows[1]['peak_bytes'] / max(rows[0]['peak_bytes'], 1):.2f}x")


if __name__ == "__main__":
    main()
