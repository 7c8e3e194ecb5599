"""Counts that say whether "read a foreign model" is one seam: run on a source tree, before and after a change.

    python bench/source_seam_counts.py src/multihead

decisions    calls outside the source registry that decide what a source is (is_*_source, tasks.kind_of, is_run,
             identify, format_of) -- the registry itself (loading.py, pretrained/, train/tasks.py) is not counted
shape_checks functions whose name says they check shapes against a model (check_shapes, _check_shapes, ...)
find_spec    places that locate a model package (the short-name lookups: "resolve copies")
resolve_defs functions named resolve outside the kernel registry (thin per-family wrappers count here)
cli_long     functions in cli/ over 60 lines
cli_compute  lines in cli/ that compute with torch or draw with matplotlib (torch.<fn>(, plt., pyplot)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

DECIDE = re.compile(r"^(is_\w+_source|kind_of|is_run|identify|format_of)$")
REGISTRY = ("loading.py", "pretrained/", "train/tasks.py")


def main(root: Path) -> dict:
    out = {"decisions": 0, "shape_checks": 0, "find_spec": 0, "resolve_defs": 0, "cli_long": [], "cli_compute": 0}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        in_registry = rel.startswith(REGISTRY)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and not in_registry:
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if DECIDE.match(name):
                    out["decisions"] += 1
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "find_spec":
                if not rel.startswith(("cli/", "bench/", "data/")):  # optional-package probes, not model lookups
                    out["find_spec"] += 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if re.search(r"check\w*shape", node.name):
                    out["shape_checks"] += 1
                if node.name == "resolve" and not rel.startswith("attention/"):
                    out["resolve_defs"] += 1
                if rel.startswith("cli/") and node.end_lineno - node.lineno + 1 > 60:
                    out["cli_long"].append(f"{rel}:{node.name} ({node.end_lineno - node.lineno + 1})")
        if rel.startswith("cli/"):
            out["cli_compute"] += sum(
                1 for line in text.splitlines() if re.search(r"torch\.\w+\(|plt\.|pyplot", line.split("#")[0])
            )
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else "src/multihead")), indent=1))
