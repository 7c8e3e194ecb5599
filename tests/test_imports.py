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


def _contract(name: str):
    """The import-linter contract ``name`` of pyproject.toml, built as lint-imports builds it."""
    import tomllib

    pytest = __import__("pytest")
    pytest.importorskip("importlinter")
    from importlinter import configuration
    from importlinter.contracts.forbidden import ForbiddenContract

    configuration.configure()  # import-linter's own settings (its timer), as lint-imports sets them

    config = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (found,) = [c for c in config["contracts"] if c["name"] == name]
    options = {k: v for k, v in found.items() if k not in ("name", "type")}
    assert found["type"] == "forbidden"
    return ForbiddenContract(name, {"root_packages": ["multihead"], "include_external_packages": True}, options)


def test_the_cache_contract_catches_a_cache_that_imports_an_attention_module():
    import grimp

    contract = _contract("the cache modules import no attention module")
    graph = grimp.build_graph("multihead", include_external_packages=True)
    assert contract.check(graph, verbose=False).kept  # as the package is
    graph.add_import(
        importer="multihead.modules.kv_policy",
        imported="multihead.modules.attention",
        line_number=1,
        line_contents="from .attention import MultiHeadAttention",
    )
    assert not contract.check(graph, verbose=False).kept  # a deliberate violation is caught
