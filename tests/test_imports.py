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
        importer="multihead.modules.kv",
        imported="multihead.modules.attention",
        line_number=1,
        line_contents="from .attention import MultiHeadAttention",
    )
    assert not contract.check(graph, verbose=False).kept  # a deliberate violation is caught


def test_the_old_flat_interpret_modules_still_import_with_a_warning():
    """interpret/ became sub-packages: the old module names import the modules at their new places, for one
    release, with a DeprecationWarning that names the new place."""
    import importlib
    import sys
    import warnings

    from multihead.interpret import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(f"multihead.interpret.{old}", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(f"multihead.interpret.{old}")
        assert module is importlib.import_module(f"multihead.interpret.{new}")
        assert any(f"moved to multihead.interpret.{new}" in str(w.message) for w in caught), old
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from multihead.interpret.roles import head_stats
    assert head_stats is importlib.import_module("multihead.interpret.roles.scores").head_stats
    assert any("moved to multihead.interpret.roles.scores.head_stats" in str(w.message) for w in caught)


def test_the_old_kv_modules_still_import_with_a_warning():
    """The KV caches and policies became one package: the old module names import it, for one release, with a
    DeprecationWarning that names the new place, and every name they had imports from there."""
    import importlib
    import sys
    import warnings

    new = importlib.import_module("multihead.modules.kv")
    for old, names in {
        "kv_cache": ["KVCache", "KVView", "LayerKV", "StreamingKV", "attend_groups"],
        "kv_policy": ["KV_POLICIES", "KVPolicy", "PolicyKV", "make_policy", "policy_cache", "compress", "Observed"],
    }.items():
        sys.modules.pop(f"multihead.modules.{old}", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(f"multihead.modules.{old}")
        assert module is new
        assert any("moved to multihead.modules.kv" in str(w.message) for w in caught), old
        assert all(getattr(module, n) is getattr(new, n) for n in names)
