"""The verb x source table (multihead.cli.verbs.VERBS): every cell either names a handler that exists or is refused
with a reason, never both and never neither; docs/verbs.md is the table as generated (regenerate it with
``python -m tests.test_verbs``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from multihead import loading
from multihead.cli import verbs
from multihead.train import tasks

DOC = Path(__file__).resolve().parents[1] / "docs" / "verbs.md"
TESTS = [  # (verb, the attached kinds it runs on, the test that checks it against HF's own model or the native reading)
    ("importance", "attached", "tests/hf/test_attached_verbs.py::test_importance_attached_equals_native"),
    (
        "prune",
        "attached",
        "tests/hf/test_attached_verbs.py::test_pruning_removes_whole_groups_and_the_saved_folder_is_the_masked_model",
    ),
    ("sinks", "attached", "tests/hf/test_attached_verbs.py::test_sinks_attached_equals_native_under_every_cache"),
    ("circuit", "attached", "tests/hf/test_attached_verbs.py::test_circuit_and_explain_attached_equal_native"),
    ("explain", "attached", "tests/hf/test_attached_verbs.py::test_circuit_and_explain_attached_equal_native"),
    (
        "export",
        "attached",
        "tests/hf/test_attached_verbs.py::test_export_of_a_pruned_attached_model_loads_in_plain_transformers",
    ),
    ("show", "attached", "tests/hf/test_attached_cli.py::test_show_writes_the_page"),
    (
        "show",
        "attached-seq2seq",
        "tests/hf/test_attached_roles.py::test_show_writes_every_encoder_decoder_and_cross_map_equal_to_hf_eager",
    ),
    ("show", "attached-encoder", "tests/hf/test_attached_roles.py::test_show_on_an_encoder_folder_equals_hf_eager"),
    ("show", "attached-vision", "tests/hf/test_attached_roles.py::test_show_on_a_vision_folder_equals_hf"),
    ("heads", "attached-seq2seq", "tests/hf/test_attached_roles.py::test_heads_reads_the_three_kinds_over_a_data_set"),
    (
        "generate",
        "attached-seq2seq",
        "tests/hf/test_attached_roles.py::test_generate_translates_with_the_encoder_as_hf_does",
    ),
    ("patch", "attached-encoder", "tests/hf/test_attached_roles.py::test_patch_on_a_masked_lm_reads_the_mask_token"),
    (
        "patch",
        "attached-seq2seq",
        "tests/hf/test_attached_roles.py::test_patch_on_a_seq2seq_folder_reads_the_decoders_next_token",
    ),
]


def markdown() -> str:
    m = verbs.matrix()
    lines = [
        "# Every verb on every kind of source",
        "",
        "Generated from the verb x source table (`multihead.verbs.VERBS`, with `REFUSES` and the task registry);",
        "`tests/test_verbs.py` checks that this page is the table. A cell names the function that serves the verb",
        "(in `multihead.cli`) or says why the verb does not apply. `attached` is an HF causal-LM folder read by",
        "transformers (any architecture whose attention goes through its registry; `hf:FOLDER` asks for this",
        "reading of a folder multihead also reads natively); `attached-encoder`, `attached-seq2seq` and",
        "`attached-vision` are HF folders of those kinds, each read with the class its config names (a",
        "sequence-to-sequence folder is never read as its decoder alone).",
        "",
        "| verb | " + " | ".join(verbs.ROUTES) + " |",
        "|---|" + "---|" * len(verbs.ROUTES),
    ]
    for verb, row in m.items():
        cells = ["no" if v.startswith("refused") else f"`{v.split(':')[1]}`" for v in row.values()]
        lines.append(f"| {verb} | " + " | ".join(cells) + " |")
    lines += ["", "## Tested on attached HF folders against HF's own model or the native reading", ""]
    lines += [f"- **{verb}** on {kinds}: `{test}`" for verb, kinds, test in TESTS]
    lines += ["", "## Why not", ""]
    for verb, row in m.items():
        reasons: dict[str, list[str]] = {}
        for route, v in row.items():
            if v.startswith("refused: "):
                reasons.setdefault(v[len("refused: ") :], []).append(route)
        for why, routes in reasons.items():
            lines.append(f"- **{verb}** on {', '.join(routes)}: {why}")
    return "\n".join(lines) + "\n"


def test_every_cell_is_served_or_refused_with_a_reason():
    for verb, row in verbs.matrix().items():
        assert set(row) == set(verbs.ROUTES)
        for route, cell in row.items():
            if cell.startswith("refused: "):
                assert len(cell) > len("refused: ") + 10, (verb, route)
                continue
            module, function = cell.split(":")
            fn = getattr(importlib.import_module(f"multihead.cli.{module}"), function, None)
            assert callable(fn), (verb, route, cell)


def test_a_served_cell_is_not_also_refused():
    for verb, table in verbs.VERBS.items():
        base = verb.split(" ")[0]
        for route in table:
            if route.startswith("run:") and route != "run:*":
                assert base not in tasks.KINDS[route[4:]].refuses, (verb, route)
            elif route in ("lm", "encoder") or route.startswith("attached"):
                assert base not in loading.REFUSES[route], (verb, route)


def test_attached_folders_take_every_verb_of_a_causal_lm():
    m = verbs.matrix()
    assert {
        v for v, row in m.items() if row["lm"] != row["attached"] and row["attached"].startswith("refused")
    } == set()
    for verb, kinds, test in TESTS:  # every tested cell is served, and its test exists
        assert not m[verb][kinds].startswith("refused"), (verb, kinds)
        path, name = test.split("::")
        assert f"def {name}(" in (DOC.parents[1] / path).read_text(), test


def test_the_page_is_the_table():
    assert DOC.read_text() == markdown(), "docs/verbs.md is stale: python -m tests.test_verbs"


if __name__ == "__main__":
    from multihead._io import atomic_write_text

    atomic_write_text(DOC, markdown())
    print(f"wrote {DOC}")


@pytest.mark.parametrize("name", ["VERBS", "ROUTES", "handler", "matrix"])
def test_the_table_s_old_place_names_its_new_one(name):
    with pytest.raises(AttributeError, match=rf"multihead.loading.{name} moved to multihead.cli.verbs.{name}"):
        getattr(loading, name)


def test_every_handler_in_the_table_is_a_function_of_the_command_line():
    for verb, table in verbs.VERBS.items():
        for route, fn in table.items():
            assert callable(fn) and fn.__module__.startswith("multihead.cli."), (verb, route, fn)
