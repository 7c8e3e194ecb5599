"""``multihead bench lens``: seven TransformerLens notebook snippets run twice on the same HF folder (SmolLM2-135M
exported by ``multihead export smollm2``): by TransformerLens 4.3 (its ``TransformerBridge`` in compatibility
mode without weight processing, in the peers' environment ``.venv-peers``) and by multihead (:mod:`multihead.interpret.causal.lens`), with **only the import and the
model line changed**. Each snippet's result is compared: the largest absolute difference, and the seconds each took.

The snippets (the way TransformerLens's docs write them): induction scores from a pattern hook on repeated random
tokens (``hook.layer()``, a name filter); previous-token scores read from ``run_with_cache(names_filter=...)`` as
``cache["pattern", layer]``; a head ablated on ``hook_z`` (``(batch, pos, head, d_head)``) with the loss before and
after (``return_type="loss"``); the residual stream patched position by position (``hook_resid_pre``) from a clean
IOI prompt into a corrupted one; the logit lens (``cache.accumulated_resid(..., apply_ln=True)`` through
``model.W_U``); direct logit attribution (``cache.decompose_resid`` + ``cache.apply_ln_to_stack`` against
``model.tokens_to_residual_directions``); each head's output patched the same way (``hook_z``). The inputs are built alike
for both (seeded random tokens; the IOI prompts through the folder's tokenizer). One departure from the docs' text,
the same for both tools: the residual patch reads the clean cache under the name it was patched at, not
``hook.name`` (TransformerLens 4.3's bridge names that hook ``blocks.L.hook_in`` inside the hook, while its cache
keeps ``blocks.L.hook_resid_pre``).

With ``--demos DIR`` (the ``demos`` folder of a TransformerLens checkout) it runs TransformerLens's own notebooks
instead: the code cells of its Main Demo, Exploratory Analysis Demo and Activation Patching demo listed in
:data:`DEMOS`, read from the notebooks as they are. Each program is the cells joined; the only lines that differ are
the imports and the model lines (:func:`programs` makes both and counts the lines changed against the notebook).
TransformerLens runs them with its model line pointed at the folder and ``enable_compatibility_mode(no_processing=True)``
(multihead reads the weights as they are); multihead with its own import and ``HookedTransformer.from_pretrained``.
Both run in the peers' environment (the notebooks import einops, jaxtyping and fancy_einsum; multihead is put on the
path), headless: plotly and circuitsvis are stand-ins that draw nothing, and ``torch.randint`` draws from one seeded
generator, so the random tokens are the same for both whatever random numbers loading a model takes. Every number
and tensor a program leaves is compared, and its printed output line by line.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

SUITE = "multihead.bench.lens"
PEER_VENV = Path(".venv-peers")
HEADERS = {  # the only lines that differ between the two runs of a snippet
    "transformer_lens": (
        "from transformer_lens import utilities as utils\n"
        "from transformer_lens.model_bridge import TransformerBridge\n"
        "model = TransformerBridge.boot_transformers(FOLDER, device='cpu')\n"
        "model.enable_compatibility_mode(no_processing=True)  # HookedTransformer's hook names, unfolded weights\n"
    ),
    "multihead": (
        "from multihead.interpret.causal.lens import HookedTransformer, utils\n"
        "model = HookedTransformer.from_pretrained(FOLDER)\n"
    ),
}
PRELUDE = """
import torch
from functools import partial
from tokenizers import Tokenizer
torch.set_grad_enabled(False)
g = torch.Generator().manual_seed(0)
seq_len = 24
rand = torch.randint(1000, 10000, (4, seq_len), generator=g)
rep_tokens = torch.cat([torch.full((4, 1), 1), rand, rand], 1)
tokens = torch.randint(1000, 10000, (2, 40), generator=g)
tok = Tokenizer.from_file(FOLDER + '/tokenizer.json')
clean_tokens = torch.tensor([tok.encode('When Mary and John went to the store, John gave a drink to').ids])
corrupted_tokens = torch.tensor([tok.encode('When Mary and John went to the store, Mary gave a drink to').ids])
answer_tokens = [tok.encode(' Mary').ids[0], tok.encode(' John').ids[0]]
def logit_diff(logits):
    return logits[0, -1, answer_tokens[0]] - logits[0, -1, answer_tokens[1]]
"""
SNIPPETS = {
    "induction_scores": """
induction_scores = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
def induction_score_hook(pattern, hook):
    stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
    induction_scores[hook.layer(), :] = stripe.mean(dim=(0, -1))
model.run_with_hooks(rep_tokens, return_type=None,
                     fwd_hooks=[(lambda name: name.endswith("pattern"), induction_score_hook)])
result = induction_scores
""",
    "previous_token_scores": """
_, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
result = torch.stack([cache["pattern", layer].diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))
                      for layer in range(model.cfg.n_layers)])
""",
    "head_ablation": """
layer_to_ablate, head_index_to_ablate = 3, 4
def head_ablation_hook(z, hook):
    z[:, :, head_index_to_ablate, :] = 0.0
    return z
original_loss = model(tokens, return_type="loss")
ablated_loss = model.run_with_hooks(tokens, return_type="loss",
                                    fwd_hooks=[(utils.get_act_name("z", layer_to_ablate), head_ablation_hook)])
result = torch.stack([original_loss, ablated_loss])
""",
    "residual_patching": """
_, clean_cache = model.run_with_cache(clean_tokens, names_filter=lambda name: name.endswith("resid_pre"))
def patch_residual_component(resid, hook, pos, name):
    resid[:, pos, :] = clean_cache[name][:, pos, :]  # (TransformerLens 4.3's bridge calls this hook blocks.L.hook_in)
    return resid
layers = list(range(0, model.cfg.n_layers, 6))
result = torch.zeros(len(layers), clean_tokens.shape[1])
for i, layer in enumerate(layers):
    for pos in range(clean_tokens.shape[1]):
        hook_fn = partial(patch_residual_component, pos=pos, name=utils.get_act_name("resid_pre", layer))
        patched = model.run_with_hooks(corrupted_tokens, fwd_hooks=[(utils.get_act_name("resid_pre", layer), hook_fn)])
        result[i, pos] = logit_diff(patched)
""",
    "logit_lens": """
logits, cache = model.run_with_cache(clean_tokens)
accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True, apply_ln=True, pos_slice=-1,
                                                       return_labels=True)
layer_logits = accumulated_residual @ model.W_U  # (component, batch, d_vocab)
result = layer_logits[:, 0, answer_tokens[0]] - layer_logits[:, 0, answer_tokens[1]]
""",
    "direct_logit_attribution": """
logits, cache = model.run_with_cache(clean_tokens)
answer_residual_directions = model.tokens_to_residual_directions(torch.tensor(answer_tokens))
logit_diff_directions = answer_residual_directions[0] - answer_residual_directions[1]
per_layer_residual, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
scaled_residual_stack = cache.apply_ln_to_stack(per_layer_residual, layer=-1, pos_slice=-1)
result = scaled_residual_stack[:, 0] @ logit_diff_directions  # (component,)
""",
    "head_patching": """
_, clean_cache = model.run_with_cache(clean_tokens, names_filter=lambda name: name.endswith("hook_z"))
def patch_head_vector(z, hook, head):
    z[:, :, head, :] = clean_cache[hook.name][:, :, head, :]
    return z
layers = list(range(0, model.cfg.n_layers, 5))
result = torch.zeros(len(layers), model.cfg.n_heads)
for i, layer in enumerate(layers):
    for head in range(model.cfg.n_heads):
        hook_fn = partial(patch_head_vector, head=head)
        patched = model.run_with_hooks(corrupted_tokens, fwd_hooks=[(utils.get_act_name("z", layer), hook_fn)])
        result[i, head] = logit_diff(patched)
""",
}


# TransformerLens's notebooks and the code cells run (by index in the notebook's cell list). Left out: set-up cells
# (Colab, IPython magics, the plotly renderer), cells for other models (distilgpt2, attn-only-2l), cells that only
# fit GPT-2's shapes (an ablation of value head 8: SmolLM2 has 3 key/value heads, and TransformerLens fails there
# too), the FactoredMatrix/OV-circuit and HookedRootModule sections, sampling, the listing of every hook point
# (TransformerLens's bridge has 40 per block here, multihead's lens the 10 it names), and the slow by-position
# sweeps (thousands of forward passes).
DEMOS = {
    "Main_Demo": (
        6,
        7,
        8,
        10,
        12,
        16,
        17,
        19,
        22,
        24,
        25,
        27,
        35,
        37,
        39,
        44,
        46,
        74,
        77,
        81,
        83,
        85,
        87,
        89,
        93,
        95,
        97,
    ),
    "Exploratory_Analysis_Demo": (
        8,
        11,
        14,
        18,
        20,
        22,
        24,
        26,
        28,
        34,
        36,
        39,
        41,
        44,
        47,
        59,
        60,
        62,
        64,
        67,
        69,
        71,
    ),
    "Activation_Patching_in_TL_Demo": (6, 7, 9, 11, 12, 14, 15, 16, 17, 19, 22, 24),
}
_MODEL = re.compile(
    r"^(\w+) = TransformerBridge\.boot_transformers\(\"[^\"]+\"(.*?)\)\n"
    r"(?:\1\.enable_compatibility_mode\([^()]*\)[^\n]*\n)?(?P<result>\1\.set_use_attn_result\(True\)\n)?",
    re.M,
)
_OURS = (  # TransformerLens's import lines and multihead's
    (r"^import transformer_lens\n", ""),
    (r"^import transformer_lens\.utilities as utils\n", "from multihead.interpret.causal.lens import utils\n"),
    (
        r"^import transformer_lens\.patching as patching\n",
        "import multihead.interpret.causal.tl_patching as patching\n",
    ),
    (
        r"^from transformer_lens\.model_bridge import TransformerBridge\n",
        "from multihead.interpret.causal.lens import HookedTransformer\n",
    ),
    (
        r"^from transformer_lens import FactoredMatrix, HookedTransformer\n",
        "from multihead.interpret.causal.lens import HookedTransformer\n",
    ),
    (r"^from transformer_lens import (.*)\n", r"from multihead.interpret.causal.lens import \1\n"),
    (
        r"^from transformer_lens\.hook_points import \(\n\s*HookPoint,\n\)(.*)\n",
        r"from multihead.interpret.causal.lens import HookPoint\1\n",
    ),
)
# TransformerLens 4.3 no longer has HookedTransformer: the Main Demo's import of it fails there, so that line goes
_TL_FIXES = (
    (
        r"^from transformer_lens import FactoredMatrix, HookedTransformer\n",
        "from transformer_lens import FactoredMatrix\n",
    ),
)


def changed_lines(before: str, after: str) -> int:
    """The lines of ``before`` that ``after`` replaces or removes (the notebook's lines touched)."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))


def programs(notebook: Path, cells, folder: str) -> dict[str, str]:
    """The notebook's ``cells`` as one program: ``original``, and as ``transformer_lens`` and ``multihead`` run it."""
    nb = json.loads(Path(notebook).read_text())
    original = ""
    for i in cells:
        cell = nb["cells"][i]
        if cell["cell_type"] != "code":
            raise ValueError(f"{notebook}: cell {i} is {cell['cell_type']}, not code (a different version of it?)")
        original += f"# ---- cell {i}\n" + "".join(cell["source"]) + "\n"

    def result(m) -> str:
        return f"{m.group(1)}.set_use_attn_result(True)\n" if m.group("result") else ""

    theirs = _MODEL.sub(
        lambda m: (
            f"{m.group(1)} = TransformerBridge.boot_transformers({folder!r}{m.group(2)})\n"
            f"{m.group(1)}.enable_compatibility_mode(no_processing=True)\n" + result(m)
        ),
        original,
    )
    ours = _MODEL.sub(
        lambda m: f"{m.group(1)} = HookedTransformer.from_pretrained({folder!r}{m.group(2)})\n" + result(m), original
    )
    for pattern, to in _TL_FIXES:
        theirs = re.sub(pattern, to, theirs, flags=re.M)
    for pattern, to in _OURS:
        ours = re.sub(pattern, to, ours, flags=re.M)
    return {"original": original, "transformer_lens": theirs, "multihead": ours}


HEADLESS = (
    "plotly",
    "plotly.express",
    "plotly.io",
    "circuitsvis",
    "circuitsvis.attention",
    "IPython",
    "IPython.display",
)


def _headless() -> None:
    """Stand-ins for the notebooks' drawing libraries (they draw nothing), and one seeded ``torch.randint``."""
    import builtins
    import types

    class Anything:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __call__(self, *args, **kwargs):
            return Anything()

        def __getattr__(self, name):
            return Anything()

        def __radd__(self, other):
            return other

        def __add__(self, other):
            return other

        def __str__(self) -> str:
            return ""

    def attribute(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()

    for name in HEADLESS:
        module = types.ModuleType(name)
        module.__file__ = f"<headless {name}>"
        module.__getattr__ = attribute  # type: ignore[method-assign]
        sys.modules[name] = module
    builtins.display = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    draws, randint = torch.Generator().manual_seed(0), torch.randint

    def seeded(*args, **kwargs):
        kwargs.setdefault("generator", draws)
        return randint(*args, **kwargs)

    torch.randint = seeded


def demo_worker(spec: dict) -> dict:
    """Run one notebook program headless; what it leaves: every float tensor (up to 10^5 numbers), number and
    string, and what it printed."""
    import contextlib
    import io

    _headless()
    torch.set_num_threads(spec.get("threads") or 2)
    program = programs(Path(spec["notebook"]), DEMOS[spec["demo"]], spec["folder"])[spec["tool"]]
    namespace: dict = {"__name__": "__main__"}
    printed = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        exec(compile(program, f"<{spec['tool']}:{spec['demo']}>", "exec"), namespace)
    values: dict = {}
    for name, v in namespace.items():
        if name.startswith("_"):
            continue
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() <= 100_000:
            values[name] = v.detach().float().tolist()
        elif isinstance(v, (int, float, str)) and not isinstance(v, bool):
            values[name] = v
    return {"seconds": time.perf_counter() - t0, "printed": printed.getvalue(), "values": values}


def compare(ours: dict, theirs: dict) -> dict:
    """The largest difference over the values both programs left, the names only one left, and the printed lines
    that differ."""
    worst, only = 0.0, sorted(set(ours["values"]) ^ set(theirs["values"]))
    differing = []
    for name in sorted(set(ours["values"]) & set(theirs["values"])):
        a, b = ours["values"][name], theirs["values"][name]
        if isinstance(a, str) or isinstance(b, str):
            if a != b:
                differing.append(name)
            continue
        ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        if ta.shape != tb.shape:
            differing.append(name)
            continue
        if ta.numel():
            worst = max(worst, float((ta - tb).abs().max()))
    lines = [
        line
        for line in difflib.unified_diff(theirs["printed"].splitlines(), ours["printed"].splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return {
        "max_abs_diff": worst,
        "compared": len(set(ours["values"]) & set(theirs["values"])),
        "only_one": only,
        "differing": differing,
        "printed_lines_differing": lines,
    }


def run_demos(*, demos: Path, model=None, threads: int | None = None, out: Path, progress: bool = True) -> dict:
    """TransformerLens's own notebooks (``demos``: the folder holding them) run by both tools (module docstring)."""
    from tqdm import tqdm

    from .harness import machine_info, write_json
    from .peers import _folder

    missing = [f"{d}.ipynb" for d in DEMOS if not (Path(demos) / f"{d}.ipynb").is_file()]
    if missing:
        raise ValueError(
            f"bench lens --demos {demos}: no {', '.join(missing)} there; pass a TransformerLens checkout's demos folder"
        )
    peer = PEER_VENV / "bin" / "python"
    if not peer.is_file():
        raise ValueError(f"bench lens --demos: TransformerLens is not installed: make peers (creates {PEER_VENV})")
    folder = str(Path(_folder(model)).resolve())
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    ours_path = str(Path(__file__).resolve().parents[2])  # the folder holding the multihead package
    results = []
    for demo in tqdm(list(DEMOS), desc="bench lens demos", disable=not progress):
        texts = programs(Path(demos) / f"{demo}.ipynb", DEMOS[demo], folder)
        row: dict = {
            "demo": demo,
            "cells": list(DEMOS[demo]),
            "lines": len(texts["original"].splitlines()),
            "changed_ours": changed_lines(texts["original"], texts["multihead"]),
            "changed_transformer_lens": changed_lines(texts["original"], texts["transformer_lens"]),
        }
        for tool in ("transformer_lens", "multihead"):
            spec = {
                "demo": demo,
                "tool": tool,
                "notebook": str(Path(demos) / f"{demo}.ipynb"),
                "folder": folder,
                "threads": threads,
            }
            tool_env = {**env, "PYTHONPATH": ours_path} if tool == "multihead" else env
            proc = subprocess.run(
                [str(peer), "-m", SUITE, "--demo", json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=3600,
                env=tool_env,
            )
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                row[tool] = {"error": f"exit {proc.returncode}: {tail[0]}"}
            else:
                row[tool] = json.loads(proc.stdout.strip().splitlines()[-1])
        if "values" in row["multihead"] and "values" in row["transformer_lens"]:
            row.update(compare(row["multihead"], row["transformer_lens"]))
        results.append(row)
        write_json(out, {"suite": "lens", "demos": True, "partial": True, "model": folder, "results": results})
    payload = {
        "suite": "lens",
        "demos": True,
        "model": folder,
        "machine": machine_info(threads or 2),
        "results": results,
    }
    write_json(out, payload)
    return payload


def source(tool: str, snippet: str, folder: str) -> str:
    """The program one tool runs for one snippet: its header, the shared inputs, the snippet."""
    return f"FOLDER = {folder!r}\n" + HEADERS[tool] + PRELUDE + SNIPPETS[snippet]


def worker(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads") or 2)
    namespace: dict = {}
    program = source(spec["tool"], spec["snippet"], spec["folder"])
    t0 = time.perf_counter()
    exec(compile(program, f"<{spec['tool']}:{spec['snippet']}>", "exec"), namespace)
    return {"value": namespace["result"].float().tolist(), "seconds": time.perf_counter() - t0}


def run(*, model=None, impls=None, threads: int | None = None, out: Path, progress: bool = True) -> dict:
    from tqdm import tqdm

    from .harness import machine_info, write_json
    from .peers import _folder

    unknown = [s for s in impls or () if s not in SNIPPETS]
    if unknown:  # before any folder is read or written
        raise ValueError(f"bench lens --impls: unknown snippets {unknown}; choose from {', '.join(SNIPPETS)}")
    folder = str(_folder(model))
    python = {"multihead": sys.executable, "transformer_lens": str(PEER_VENV / "bin" / "python")}
    results = []
    for snippet in tqdm(list(impls or SNIPPETS), desc="bench lens", disable=not progress):
        row: dict = {"snippet": snippet}
        for tool in ("multihead", "transformer_lens"):
            if not Path(python[tool]).is_file():
                row[tool] = {"error": f"not installed: make peers (creates {PEER_VENV})"}
                continue
            spec = {"tool": tool, "snippet": snippet, "folder": folder, "threads": threads}
            proc = subprocess.run(
                [python[tool], "-m", SUITE, json.dumps(spec)], capture_output=True, text=True, timeout=3600
            )
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                row[tool] = {"error": f"exit {proc.returncode}: {tail[0]}"}
            else:
                row[tool] = json.loads(proc.stdout.strip().splitlines()[-1])
        ours, theirs = row.get("multihead", {}), row.get("transformer_lens", {})
        if "value" in ours and "value" in theirs:
            a, b = torch.tensor(ours["value"]), torch.tensor(theirs["value"])
            row["max_abs_diff"] = float((a - b).abs().max()) if a.shape == b.shape else None
            row["shape"] = list(a.shape)
        results.append(row)
        write_json(out, {"suite": "lens", "partial": True, "model": folder, "results": results})
    payload = {
        "suite": "lens",
        "model": folder,
        "machine": machine_info(threads or 2),
        "headers": HEADERS,
        "snippets": SNIPPETS,
        "results": results,
    }
    write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    if payload.get("demos"):
        return _format_demos(payload)
    lines = [
        f"{payload['model']}: {len(payload['results'])} TransformerLens snippets, only the import and the model line "
        "changed",
        f"{'snippet':<26}{'shape':<12}{'max |diff|':>11}{'ours s':>9}{'TL s':>9}",
    ]
    for r in payload["results"]:
        ours, tl = r.get("multihead", {}), r.get("transformer_lens", {})
        err = ours.get("error") or tl.get("error")
        if err:
            lines.append(f"{r['snippet']:<26}{err}")
            continue
        d = r.get("max_abs_diff")
        lines.append(
            f"{r['snippet']:<26}{'x'.join(map(str, r.get('shape', []))):<12}"
            f"{(f'{d:.1e}' if d is not None else 'shapes differ'):>11}{ours['seconds']:>9.1f}{tl['seconds']:>9.1f}"
        )
    return "\n".join(lines)


def _format_demos(payload: dict) -> str:
    lines = [
        f"{payload['model']}: TransformerLens's own notebooks, run by both",
        f"{'notebook':<32}{'cells':>6}{'lines':>7}{'changed':>9}{'values':>8}{'max |diff|':>11}{'printed':>9}"
        f"{'ours s':>8}{'TL s':>8}",
    ]
    for r in payload["results"]:
        ours, tl = r.get("multihead", {}), r.get("transformer_lens", {})
        err = ours.get("error") or tl.get("error")
        if err:
            lines.append(f"{r['demo']:<32}{err}")
            continue
        lines.append(
            f"{r['demo']:<32}{len(r['cells']):>6}{r['lines']:>7}{r['changed_ours']:>9}{r['compared']:>8}"
            f"{r['max_abs_diff']:>11.1e}{len(r['printed_lines_differing']):>9}{ours['seconds']:>8.1f}{tl['seconds']:>8.1f}"
        )
    lines.append(
        "changed: the notebook's lines touched for multihead (imports and the model line); printed: "
        "printed lines that differ"
    )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"lens-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench lens`` (the suite protocol in :mod:`multihead.bench`); ``--impls`` picks snippets,
    ``--demos DIR`` runs TransformerLens's own notebooks from DIR instead."""
    if getattr(args, "demos", None):
        return run_demos(demos=Path(args.demos), model=args.model, threads=args.threads, out=out)
    return run(model=args.model, impls=args.impls, threads=args.threads, out=out)


if __name__ == "__main__":
    if sys.argv[1] == "--demo":
        print(json.dumps(demo_worker(json.loads(sys.argv[2]))))
    else:
        print(json.dumps(worker(json.loads(sys.argv[1]))))
