"""Chat templates from model files, rendered with bounded time, memory and output: every template error (syntax,
sandbox refusals, undefined names, include, recursion, huge ranges, loops and string products that would exhaust
memory or time) comes back as a message naming the file and the fix; from the command line, exit 2."""

from __future__ import annotations

import dataclasses

import gguf
import pytest

from gguf_edits import rewrite
from hf_families import hf_model, write_gguf
from multihead import lm
from multihead.cli import main
from multihead.lm import LMError
from multihead.pretrained import chat


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    return write_gguf(hf_model("llama", rope_scaling=None), tmp_path_factory.mktemp("g") / "chat.gguf")


@pytest.fixture(scope="module")
def loaded(gguf_path):
    return lm.load(gguf_path)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(chat, "SECONDS", 3)  # the time limit, shortened for the tests that hit it


HOSTILE = {
    "syntax": ("{% for %}", "is not valid jinja2"),
    "undefined": ("{{ foo.bar }}", "uses a name it was not given"),
    "mro": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "tried something the sandbox forbids"),
    "cycler": ("{{ cycler.__init__.__globals__ }}", "tried something the sandbox forbids"),
    "include": ("{% include 'secrets.txt' %}", "includes or imports another template"),
    "raise": ("{{ raise_exception('roles must alternate user/assistant') }}", "refused the messages: roles must"),
    "recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed without end"),
    "range_1e9": ("{% for i in range(1000000000) %}{% endfor %}", "asked for a range too large"),
    "lipsum": ("{{ lipsum(n=100000000) }}", "uses a name it was not given"),
    "strmul": ("{{ 'x' * 10000000000 }}", "produced more text than a prompt can hold"),
    # runaway templates that may meet the output, memory or time limit first, by the machine's load: the class of
    # refusal is asserted, not which limit fired (the test gives the same verdict idle and busy)
    "nested_loop": (
        "{% for i in range(99999) %}{% for j in range(99999) %}xxxxxxxx{% endfor %}{% endfor %}",
        chat.LIMIT_HIT,
    ),
    "silent_loop": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "ran for over"),
    "doubling": (
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        chat.LIMIT_HIT,
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_templates_are_refused_naming_the_file(loaded, gguf_path, quick, case):
    template, fragment = HOSTILE[case]
    bad = dataclasses.replace(loaded, chat_template=template)
    with pytest.raises(LMError) as info:
        bad.chat("hello")
    message = str(info.value)
    assert fragment in message, message
    if fragment == chat.LIMIT_HIT:  # and it says which limit it was
        assert any(chat._WHAT[k].split(" (")[0].split("{")[0] in message for k in chat.LIMITS), message
    assert f"{gguf_path} (metadata tokenizer.chat_template)" in message
    assert "without --chat" in message  # the fix


def test_a_good_template_renders_as_jinja_would(loaded):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat sat"}]
    ours = dataclasses.replace(loaded, chat_template=template).chat(messages)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    assert ours == env.from_string(template).render(messages=messages, add_generation_prompt=True, **loaded.special)


@pytest.mark.timeout(120)
def test_the_command_line_answers_hostile_templates_with_exit_2(gguf_path, tmp_path, capsys, quick):
    for name in ("mro", "nested_loop", "syntax"):
        bad = rewrite(
            gguf_path,
            tmp_path / f"{name}.gguf",
            meta={"tokenizer.chat_template": (HOSTILE[name][0], gguf.GGUFValueType.STRING)},
        )
        assert main(["generate", str(bad), "hi", "--chat", "--max-new", "2"]) == 2
        err = capsys.readouterr().err
        assert HOSTILE[name][1] in err and str(bad) in err and "internal error" not in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["mro", "nested_loop"])
def test_an_hf_folders_chat_template_file_is_held_to_the_same(tmp_path, capsys, quick, case):
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path / "gpt2"
    hf_model("gpt2").save_pretrained(folder)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat sat on the mat"] * 10, vocab_size=280, min_frequency=1)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(HOSTILE[case][0])
    assert main(["generate", str(folder), "hi", "--chat", "--max-new", "2"]) == 2
    err = capsys.readouterr().err
    assert HOSTILE[case][1] in err and str(folder / "chat_template.jinja") in err
