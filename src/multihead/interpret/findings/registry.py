"""The findings' registry: :class:`Finding`, :data:`FINDINGS` and what every finding shares (its page, its
report)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor


@dataclass(frozen=True)
class Text:
    """What a finding reads besides the model: ``rows(length)``, held-out token ids ``(n, length)``,
    ``encode(text)``, the model's tokenizer (no special tokens added), and ``needles(length, count)``, needle
    prompts (:class:`~multihead.data.needles.Needle`) of that length (None: the finding measures no needles)."""

    rows: Callable[[int], Tensor]
    encode: Callable[[str], list[int]]
    needles: Callable[[int, int], list] | None = None


@dataclass(frozen=True)
class Finding:
    """One finding: ``paper`` and ``claim`` (the paper's words, shortened), ``measures`` (what the command measures),
    ``run(model, text, options, progress) -> payload`` (``text``: the model's :class:`Text`),
    ``steps(options)``: how many progress steps it takes, ``lengths(options)``: the text lengths it reads (checked
    against the model's positions before it runs), and ``plot(payload, path)``. The payload holds
    ``verdict`` (one line: what was measured) and ``reproduced`` (whether it matches the paper's claim)."""

    name: str
    paper: str
    claim: str
    measures: str
    run: Callable[..., dict]
    steps: Callable[[dict], int]
    lengths: Callable[[dict], list[int]]
    plot: Callable[[dict, Path], None]
    takes: str = "lm"


MODEL_KINDS = {
    "lm": ("a causal LM", "smollm2"),
    "whisper": ("a Whisper model", "whisper"),
    "dinov2": ("a DINOv2 ViT", "dinov2"),
}


def check_kind(finding: Finding, kind: str, model: str) -> None:
    """Refuse, naming the kind it measures, a finding asked of a model of another kind."""
    if finding.takes != kind:
        raise ValueError(
            f"{finding.name} measures {MODEL_KINDS[finding.takes][0]} (e.g. {MODEL_KINDS[finding.takes][1]}); "
            f"{model} is {MODEL_KINDS[kind][0]}"
        )


FINDINGS: dict[str, Finding] = {}


def register(finding: Finding) -> Finding:
    FINDINGS[finding.name] = finding
    return finding


def check_name(name: str) -> Finding:
    """The finding called ``name``, or a refusal naming every one."""
    if name not in FINDINGS:
        raise ValueError(f"no finding is called {name!r}; choose one of {', '.join(FINDINGS)}")
    return FINDINGS[name]


def run(name: str, model, text: Text, options: dict, progress=None) -> dict:
    """Measure finding ``name`` on ``model``: the payload (``finding``, ``paper``, ``claim``, the options, the
    measurements, ``verdict`` and ``reproduced``)."""
    f = check_name(name)
    payload = f.run(model, text, options, progress)
    return {"finding": f.name, "paper": f.paper, "claim": f.claim, "measures": f.measures, **options, **payload}


def page(payload: dict) -> str:
    """The finding's page (Markdown): the paper's claim beside the measurement, the figure, the numbers per layer."""
    lines = [
        f"# {payload['finding']} on {payload.get('model', 'the model')}",
        "",
        f"**The paper** ({payload['paper']}) says: {payload['claim']}",
        "",
        f"**We measure** {payload['measures']}",
        "",
        f"**On {payload.get('model', 'this model')}:** {payload['verdict']}.",
        "",
        f"Reproduced: {'yes' if payload['reproduced'] else 'no'}.",
        "",
        f"![{payload['finding']}]({payload['finding']}.png)",
        "",
        f"The numbers are in `{payload['finding']}.json`.",
    ]
    return "\n".join(lines) + "\n"


def report(payload: dict, out, *, overwrite: bool = False, sources: tuple = ()) -> None:
    """Print the verdict and, with ``out``, write ``NAME.json``, ``NAME.png`` and ``README.md`` there (built aside
    and swapped in: nothing half-written)."""
    from ..._io import Publish, atomic_write_json, atomic_write_text

    name = payload["finding"]
    print(f"{name}: {payload['verdict']} (reproduced: {'yes' if payload['reproduced'] else 'no'})")
    if not out:
        return
    with Publish(out, "findings", overwrite=overwrite, sources=sources) as folder:
        atomic_write_json(folder / f"{name}.json", payload)
        FINDINGS[name].plot(payload, folder / f"{name}.png")
        atomic_write_text(folder / "README.md", page(payload))
    print(f"wrote {Path(out) / (name + '.json')}, {name}.png and README.md")


__all__ = [
    "FINDINGS",
    "MODEL_KINDS",
    "Finding",
    "Text",
    "check_kind",
    "check_name",
    "page",
    "register",
    "report",
    "run",
]
