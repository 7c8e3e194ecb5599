"""Attach over every model type transformers knows: each type of its auto tables (causal LM, seq2seq, masked LM /
encoder, image classification, speech seq2seq, audio classification) built from its own config class with small
sizes (random weights, no download), attached, and checked against HF itself: outputs equal HF's own, every
captured pattern equal to one of HF eager's ``output_attentions``, and zero-ablating a head equal to zeroing its
slice of the output projection's input by hand. A type whose layers call HF's attention registry is served through
it; a type whose layers compute attention themselves is attached by observation at the function level (fused SDPA,
or softmax(q k^T) v written by hand); the *source* column says which. A type that cannot be built from a config
alone, or whose probe pass fails, is listed with the reason; a type neither source can serve is refused by name.

``make coverage`` writes the table for both transformers lines (docs/attach-coverage.md);
``tests/hf/test_coverage.py`` runs the same survey and fails on any attached type that disagrees with HF.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass

import torch

# (kind, the auto table, the class that builds it); a type is surveyed under the first table that lists it
TABLES = (
    ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    ("speech", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq"),
    ("encoder", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModel"),
    ("causal", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    ("vision", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModel"),
    ("audio", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModel"),
)
# small sizes, set where the config has the attribute
SMALL = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "hidden_dim_size"), 64),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads"),
        4,
    ),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers"), 2),
    **dict.fromkeys(
        ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "hidden_dim", "n_inner"), 128
    ),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_size", "kv_channels"), 16),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    "num_experts_per_tok": 2,
    "image_size": 32,
    "patch_size": 8,
    "num_mel_bins": 16,
    "max_source_positions": 16,
}


@dataclass
class Row:
    model_type: str
    kind: str
    stage: str  # built | not built | small config fails | refused | attached
    why: str = ""
    source: str = ""  # what served an attached type: registry | observed
    outputs: float | None = None  # max |attached - HF|
    patterns: str = ""  # "n/n equal" or why not compared
    ablation: str = ""

    @property
    def agrees(self) -> bool | None:
        if self.stage != "attached":
            return None
        return (
            self.outputs is not None
            and self.outputs <= 1e-4
            and not self.patterns.startswith("differ")
            and not self.ablation.startswith("differs")
        )


def _why(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:140]}"


def types() -> list[tuple[str, str, str]]:
    """``(model_type, kind, builder class)`` for every type of :data:`TABLES`, each once."""
    from transformers.models.auto import modeling_auto as auto

    seen: dict[str, tuple[str, str, str]] = {}
    for kind, table, cls in TABLES:
        for t in getattr(auto, table, {}):
            seen.setdefault(t, (t, kind, cls))
    return sorted(seen.values())


# per-layer lists (one entry per layer) and lists of layer indices a hybrid's config keeps
PER_LAYER = ("layer_types", "layers_block_type", "block_types", "mlp_layer_types")
LAYER_INDICES = ("attn_layer_indices", "hybrid_layer_ids", "full_attn_idxs")


def _kept_layers(config, small: int) -> list[int] | None:
    """Which of a hybrid's layers to keep: the first of each kind its per-layer lists name (so that a shrunk
    Qwen3-Next keeps a full-attention layer beside its linear ones), filled up to ``small``; None for a config
    without per-layer lists."""
    lists = [v for key in PER_LAYER if isinstance(v := getattr(config, key, None), list) and v]
    if not lists:
        return None
    n = min(len(v) for v in lists)
    kinds = [tuple(v[i] for v in lists) for i in range(n)]
    keep = sorted({kinds.index(k) for k in dict.fromkeys(kinds)})
    keep += [i for i in range(n) if i not in keep][: max(0, small - len(keep))]
    return sorted(keep)


LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers")
# How far a config is shrunk: every size (the first try), only its layer counts (where smaller widths break a
# relation between sizes the config class does not keep), or not at all (a config already small enough)
LEVELS = ("small", "layers", "default")


def _shrink(config, depth: int = 0, only: tuple[str, ...] | None = None) -> None:
    small = SMALL["num_hidden_layers"]
    keep = _kept_layers(config, small)
    for key, value in SMALL.items():
        if only is not None and key not in only:
            continue
        current = getattr(config, key, None)
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            with contextlib.suppress(Exception):
                setattr(config, key, value)
    if keep is not None and isinstance(getattr(config, "num_hidden_layers", None), int):
        with contextlib.suppress(Exception):
            for key in PER_LAYER:
                v = getattr(config, key, None)
                if isinstance(v, list) and len(v) > max(keep):
                    setattr(config, key, [v[i] for i in keep])
            for key in LAYER_INDICES:
                v = getattr(config, key, None)
                if isinstance(v, list):
                    setattr(config, key, [j for j, i in enumerate(keep) if i in v])
            config.num_hidden_layers = len(keep)
    layers = getattr(config, "num_hidden_layers", None)
    # Jamba's and Zamba's attention every ``period`` layers from ``offset``: one attention layer among the few kept
    for period, offset in (("attn_layer_period", "attn_layer_offset"), ("expert_layer_period", "expert_layer_offset")):
        if (
            isinstance(layers, int)
            and isinstance(getattr(config, period, None), int)
            and getattr(config, period) > layers
        ):
            with contextlib.suppress(Exception):
                setattr(config, period, layers)
                setattr(config, offset, min(getattr(config, offset, 0) or 0, layers - 1))
    for key in ("attn_layer_indices",):
        v = getattr(config, key, None)
        if isinstance(v, list) and isinstance(layers, int) and len(v) > layers:
            with contextlib.suppress(Exception):
                setattr(config, key, v[:layers])
    if depth < 2:
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None and hasattr(sub, "to_dict"):
                _shrink(sub, depth + 1, only)


def _first_tensor(out) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if hasattr(out, "values") else out if isinstance(out, (tuple, list)) else ()
    for v in values:
        t = _first_tensor(v)
        if t is not None and t.is_floating_point():
            return t
    return None


def _attentions(out) -> list[torch.Tensor]:
    found = []
    for key, value in out.items():
        if "attentions" in key and isinstance(value, (tuple, list)):
            found += [t for t in value if isinstance(t, torch.Tensor)]
        elif hasattr(value, "items"):
            found += _attentions(value)
    return found


def _trailing_equal(theirs: torch.Tensor, ours: torch.Tensor) -> bool:
    """Whether HF's map is ours without leading positions (the same batch and heads, the last queries and keys)."""
    if theirs.dim() != 4 or ours.dim() != 4 or theirs.shape[:2] != ours.shape[:2]:
        return False
    lq, lk = theirs.shape[-2:]
    if lq > ours.shape[-2] or lk > ours.shape[-1]:
        return False
    return bool(torch.allclose(theirs, ours[..., -lq:, -lk:], atol=1e-5))


def _build(model_type: str, cls_name: str, implementation: str | None = None, level: str = "small"):
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    if level != "default":
        _shrink(config, only=LAYER_KEYS if level == "layers" else None)
    torch.manual_seed(0)
    kwargs = {"attn_implementation": implementation} if implementation else {}
    return getattr(transformers, cls_name).from_config(config, **kwargs).eval()


def _built(model_type: str, kind: str, cls_name: str, level: str):
    """``(model, probe inputs, HF's own output)`` of ``model_type`` shrunk to ``level``, or the Row saying why not."""
    from multihead.hf.attach import probe_inputs

    try:
        with torch.device("meta"):  # sizes first: a config the shrinking missed is not allocated
            size = sum(p.numel() for p in _build(model_type, cls_name, level=level).parameters())
        if size > 60_000_000:
            return Row(model_type, kind, "not built", f"its config shrunk here still has {size / 1e6:.0f}M parameters")
        model = _build(model_type, cls_name, level=level)
    except Exception as exc:  # noqa: BLE001  whatever a config class raises without its checkpoint's values
        return Row(model_type, kind, "not built", _why(exc))
    try:
        x = probe_inputs(model)
        with torch.no_grad():
            ref = _first_tensor(model(**x))
    except Exception as exc:  # noqa: BLE001
        return Row(model_type, kind, "small config fails", "HF's own forward: " + _why(exc))
    return model, x, ref


def survey_one(model_type: str, kind: str, cls_name: str) -> Row:
    from multihead import hf
    from multihead.interpret.causal.patching import ablated
    from multihead.modules import capture

    row = Row(model_type, kind, "built")
    first: Row | None = None  # the smallest level's failure, reported where no level runs
    for level in LEVELS:
        built = _built(model_type, kind, cls_name, level)
        if isinstance(built, Row):
            first = first or built
            continue
        model, x, ref = built
        break
    else:
        return first
    if level != "small":
        row.why = f"built with {'only its layer counts shrunk' if level == 'layers' else 'its default config'}"
    why = hf.why_not(model, example=x)
    if why is not None:
        return Row(model_type, kind, "refused", why[:220] if len(why) < 400 else why[:200] + " ... " + why[-200:])
    att = hf.attach(model, example=x)
    row.stage, row.source = "attached", att.source
    try:
        with torch.no_grad(), capture(model, ("pattern",)) as cache:
            out = _first_tensor(model(**x))
        row.outputs = float((out - ref).abs().max()) if out is not None and ref is not None else None
        ours = cache.patterns()
        try:
            eager = _build(model_type, cls_name, "eager", level=level)
            eager.load_state_dict(model.state_dict(), strict=False)
            with torch.no_grad():
                eager_out = eager(**x, output_attentions=True)
            theirs = _attentions(eager_out)
            own = _first_tensor(eager_out)
            if own is not None and ref is not None and float((own - ref).abs().max()) > 1e-4:
                theirs = None
                row.patterns = (
                    f"not compared: HF's eager differs from its own default ({float((own - ref).abs().max()):.0e})"
                )
        except Exception as exc:  # noqa: BLE001
            theirs = None
            row.patterns = f"not compared: eager gives no maps ({type(exc).__name__})"
        if theirs is not None:
            if not theirs:
                row.patterns = "not compared: eager returns no attentions"
            else:
                unused, equal, sunk, sliced, averaged, scored = list(range(len(theirs))), 0, 0, 0, 0, 0
                for p in ours:
                    # a model whose sinks scale the output after the softmax (Granite SWA) reports eager weights
                    # before that scaling: ours, with the sink's share removed, renormalised
                    q = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
                    j = next(
                        (j for j in unused if theirs[j].shape == p.shape and torch.allclose(theirs[j], p, atol=1e-5)),
                        None,
                    )
                    if j is None:  # HF returns the maps without positions the model adds (CPM-Ant's prompt)
                        j = next((j for j in unused if _trailing_equal(theirs[j], p)), None)
                        sliced += j is not None
                    if j is None:  # HF returns the heads' average for every head (WavLM, through PyTorch's MHA)
                        mean = p.mean(1, keepdim=True).expand_as(p)
                        j = next(
                            (
                                j
                                for j in unused
                                if theirs[j].shape == p.shape and torch.allclose(theirs[j], mean, atol=1e-5)
                            ),
                            None,
                        )
                        averaged += j is not None
                    if j is None:  # HF returns the scores before the softmax (SqueezeBERT)
                        j = next(
                            (
                                j
                                for j in unused
                                if theirs[j].shape == p.shape
                                and torch.allclose(theirs[j].float().softmax(-1), p, atol=1e-5)
                            ),
                            None,
                        )
                        scored += j is not None
                    if j is None:
                        j = next(
                            (
                                j
                                for j in unused
                                if theirs[j].shape == p.shape and torch.allclose(theirs[j], q, atol=1e-5)
                            ),
                            None,
                        )
                        sunk += j is not None
                    if j is not None:
                        unused.remove(j)
                        equal += 1
                note = f" ({sunk} as eager's weights before its sink scaling)" if sunk else ""
                note += f" ({sliced} on the positions HF returns)" if sliced else ""
                note += f" ({averaged} against HF's average over heads, which is all it returns)" if averaged else ""
                note += (
                    f" ({scored} against HF's scores before the softmax, which is what it returns)" if scored else ""
                )
                if equal == len(ours):
                    row.patterns = f"{equal}/{len(ours)} equal{note}"
                elif equal == len(theirs):  # every map HF returns is equal; HF returns none for the others
                    row.patterns = f"{equal}/{len(ours)} equal{note} ({len(ours) - equal} not returned by HF)"
                else:
                    row.patterns = f"differ: {equal}/{len(ours)}"
        first = next(iter(att.layers.values()))
        proj = first.out_proj
        if first.z_feeds_output is False:
            row.ablation = (
                "not compared: the layer transforms the heads' outputs before its projection (attach says so)"
            )
        elif not (isinstance(proj, torch.nn.Linear) or type(proj).__name__ == "Conv1D") or first.num_heads < 2:
            row.ablation = "not compared: no separate output projection"
        else:
            w = proj.weight
            d = (w.shape[1] if isinstance(proj, torch.nn.Linear) else w.shape[0]) // first.num_heads  # value width
            with ablated(model, {0: [1]}), torch.no_grad():
                ab = _first_tensor(model(**x))

            # head 1's columns of the projection zeroed in its weight (a layer may use the weight without calling the
            # module: PyTorch's multi_head_attention_forward)
            kept = w.detach().clone()
            with torch.no_grad():
                if isinstance(proj, torch.nn.Linear):
                    w[:, d : 2 * d] = 0
                else:  # Conv1D: (in, out)
                    w[d : 2 * d] = 0
            try:
                with torch.no_grad():
                    hand = _first_tensor(model(**x))
            finally:
                with torch.no_grad():
                    w.copy_(kept)
            diff = float((ab - hand).abs().max())
            row.ablation = f"equal ({diff:.0e})" if diff <= 1e-5 else f"differs ({diff:.1e})"
    finally:
        hf.detach(model)
    return row


def survey(selected: list[tuple[str, str, str]] | None = None, progress: bool = False) -> list[Row]:
    from tqdm import tqdm

    rows = []
    for t, kind, cls in tqdm(selected or types(), desc="attach coverage", disable=not progress):
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                rows.append(survey_one(t, kind, cls))
            except Exception as exc:  # noqa: BLE001  a failure of the survey itself is a row too
                rows.append(Row(t, kind, "error", _why(exc)))
    return rows


def markdown(rows: list[Row], version: str) -> str:
    count = {
        s: sum(r.stage == s for r in rows) for s in ("attached", "refused", "not built", "small config fails", "error")
    }
    agree = sum(bool(r.agrees) for r in rows)
    by = {src: sum(r.source == src and bool(r.agrees) for r in rows) for src in ("registry", "observed")}
    lines = [
        f"## transformers {version}",
        "",
        f"{len(rows)} model types; {count['attached']} attached ({agree} equal to HF on every check: "
        f"{by['registry']} through the registry, {by['observed']} by observation), "
        f"{count['refused']} refused by name, {count['not built']} not buildable from a config alone, "
        f"{count['small config fails']} whose small config does not run in HF's own forward pass, "
        f"{count['error']} errors.",
        "",
        "| model type | kind | result | source | outputs max diff | patterns vs eager | ablation vs by hand | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = "" if r.outputs is None else f"{r.outputs:.0e}"
        result = {True: "attached, equal", False: "attached, DIFFERS", None: r.stage}[r.agrees]
        why = r.why.replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r.model_type} | {r.kind} | {result} | {r.source} | {diff} | {r.patterns} | {r.ablation} | {why} |"
        )
    return "\n".join(lines) + "\n"


def page(sections: list[str]) -> str:
    """docs/attach-coverage.md: this module's account of the survey, then one section per transformers line."""
    intro = " ".join(__doc__.split("\n\n")[0].split())
    return "# Attach coverage: every model type transformers knows\n\n" + intro + "\n\n" + "\n".join(sections)


if __name__ == "__main__":
    import sys

    from multihead._io import atomic_write_text

    if sys.argv[1:2] == ["join"]:  # python -m tests.hf.coverage join A.md B.md OUT.md
        *parts, out = sys.argv[2:]
        atomic_write_text(out, page([open(f).read() for f in parts]))
        raise SystemExit(0)
    import transformers

    text = markdown(survey(progress=True), transformers.__version__)
    atomic_write_text(sys.argv[1], text)  # python -m tests.hf.coverage SECTION.md
    print(text.splitlines()[2])
