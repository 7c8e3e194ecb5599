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
"""

from __future__ import annotations

import json
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


def default_out() -> Path:
    return Path("bench/results") / f"lens-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench lens`` (the suite protocol in :mod:`multihead.bench`); ``--impls`` picks snippets."""
    return run(model=args.model, impls=args.impls, threads=args.threads, out=out)


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
