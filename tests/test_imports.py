"""What import-linter's contracts cannot say: no module inside the package imports the package root
(``import multihead`` re-exports every layer, so it would hide an upward import from the layers contract)."""

import ast
from pathlib import Path

import multihead

ROOT = Path(multihead.__file__).parent


def test_no_module_imports_the_package_root():
    found = []
    for path in ROOT.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            root_names = []  # `from .. import x` at the package root: fine for a submodule, not for a re-export
            if isinstance(node, ast.ImportFrom) and node.level == len(path.relative_to(ROOT).parts) and not node.module:
                root_names = [
                    a.name for a in node.names if not ((ROOT / a.name).is_dir() or (ROOT / f"{a.name}.py").is_file())
                ]
            if "multihead" in names or root_names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], found
