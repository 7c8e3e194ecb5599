"""HF folders of causal LMs that multihead has no native reader for, loaded with transformers and attached.

The source registry (:func:`multihead.loading.kind`) sends an HF folder here when its ``model_type`` is no native
family's and transformers knows it: :func:`why_not_folder` answers without reading a weight, :func:`load` reads it.
Before any weight is read the folder's ``config.json`` goes through multihead's JSON reader (size and depth
bounded), the model is built on the meta device to count its parameters against the ceiling
(``MULTIHEAD_MAX_PARAMETERS``), and only safetensors weights are read (no pickle). The result is a
:class:`~multihead.pretrained.causal_lm.PretrainedLM` whose model is an :class:`AttachedLM`: the attached HF model
behind multihead's calling convention ``model(ids, keep) -> logits``, so that ``show`` and ``heads`` (maps and
exact statistics) take it as they take a native LM.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from .attach import INSTALL, AttachError, attach, why_not


def _model_type(path: Path) -> tuple[str | None, dict]:
    from ..pretrained.formats.hf import read_config

    hf = read_config(path)
    kind = hf.get("model_type")
    return (kind if isinstance(kind, str) else None), hf


def why_not_folder(path: str | Path) -> str | None:
    """Why the HF folder ``path`` cannot be loaded attached (None: it can be), from its config alone."""
    return _why_not_type(_model_type(Path(path))[0])


def _why_not_type(kind: str | None) -> str | None:
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return f"reading it needs transformers, which is not installed: {INSTALL}"
    if kind not in CONFIG_MAPPING_NAMES:
        return (
            f"model_type {kind!r} is not an architecture transformers {transformers.__version__} knows "
            "(nor multihead); a folder made by another library, or a newer transformers release"
        )
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return (
            f"{kind} is not a causal LM; the command line reads other HF architectures natively (BERT, DINOv2, "
            "Whisper) and any attachable one from Python: multihead.hf.attach(AutoModel.from_pretrained(...))"
        )
    return None


class AttachedLM(nn.Module):
    """An attached HF causal LM called as multihead's LMs are: ``model(ids, keep=None, head_mask=None) ->
    logits (B, L, V)``. ``head_mask`` ``(layers, H)`` (or ``(B, layers, H)``) scales each head's output (``hook_z``),
    as multihead's ``head_mask`` does. ``config`` holds what the analyses read: ``max_len``, ``pad_id``,
    ``vocab_size``, ``positional``."""

    def __init__(self, model: nn.Module, pad_id: int):
        super().__init__()
        self.hf = model
        c = model.config
        rotary = getattr(c, "rope_theta", None) is not None or "rope" in str(getattr(c, "rope_scaling", "") or "")
        rotary = rotary or getattr(c, "rotary_pct", None) is not None or getattr(c, "rope_parameters", None)
        self.config = SimpleNamespace(
            max_len=int(getattr(c, "max_position_embeddings", 0) or getattr(c, "n_positions", 0) or 2048),
            pad_id=pad_id,
            vocab_size=int(c.vocab_size),
            positional="rotary" if rotary else "learned",
            model_type=c.model_type,
        )

    def forward(self, ids: Tensor, keep: Tensor | None = None, head_mask: Tensor | None = None) -> Tensor:
        from .attach import attached

        handles = []
        if head_mask is not None:
            for i, rec in enumerate(attached(self.hf).layers.values()):
                scale = head_mask[..., i, :]  # (H,) or (B, H)
                shape = (1, -1, 1, 1) if scale.dim() == 1 else (scale.shape[0], -1, 1, 1)
                scale = scale.reshape(shape)
                handles.append(rec.hook_z.add_hook(lambda z, hook, s=scale: z * s.to(z.dtype)))
        try:
            return self.hf(input_ids=ids, attention_mask=keep).logits
        finally:
            for h in handles:
                h.remove()

    @property
    def embed(self) -> nn.Module:
        """The token embedding (``weight`` ``(V, E)``), as multihead's LMs name it."""
        return self.hf.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        """The unembedding (``weight`` ``(V, E)``)."""
        return self.hf.get_output_embeddings()

    @torch.no_grad()
    def generate(
        self,
        ids: Tensor,
        *,
        strategy: str = "greedy",
        max_new_tokens: int = 32,
        stop_tokens=(),
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        streamer=None,
    ) -> Tensor:
        """Continue ``ids`` ``(B, L)`` with HF's own ``generate`` loop (its KV cache) running multihead's attention;
        the options are :func:`multihead.models.generation.generate`'s (greedy or sampling), and ``streamer(tokens
        (B,), alive (B,))`` is called with every new token. Returns the new tokens ``(B, n)``."""
        from transformers.generation.streamers import BaseStreamer

        if strategy not in ("greedy", "sample"):
            raise ValueError(f"an attached HF model decodes greedy or sample, not {strategy!r}")

        class Stream(BaseStreamer):
            prompt_seen = False

            def put(self, value) -> None:
                if not self.prompt_seen:  # HF hands the prompt over first
                    self.prompt_seen = True
                    return
                if streamer is not None:
                    tokens = value.view(-1)
                    streamer(tokens, torch.ones_like(tokens, dtype=torch.bool))

            def end(self) -> None:
                pass

        if seed is not None:  # as multihead's sampling: a seed makes it repeatable, none draws a fresh one
            torch.manual_seed(seed)
        sample = strategy == "sample"
        out = self.hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature if sample else None,
            top_k=(top_k or None) if sample else None,
            top_p=top_p if sample else None,
            eos_token_id=list(stop_tokens) or None,
            pad_token_id=self.config.pad_id,
            streamer=Stream(),
        )
        return out[:, ids.shape[1] :]


def load(path: str | Path, *, backend: str = "auto", device: str = "cpu"):
    """The HF causal-LM folder ``path`` read by transformers (safetensors only), attached, with its tokenizer, as
    a :class:`~multihead.pretrained.causal_lm.PretrainedLM` (family ``hf:<model_type>``)."""
    from .._config import check_size
    from ..pretrained.causal_lm import _folder_tokenizer, bundle

    path = Path(path)
    kind, hf = _model_type(path)
    why = _why_not_type(kind)
    if why is not None:
        raise AttachError(f"{path}: {why}")
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001  transformers 5 validates with huggingface_hub's own error classes
        raise AttachError(f"{path / 'config.json'}: transformers cannot read it ({str(exc)[:300]})") from None
    with torch.device("meta"):  # sizes first: nothing is allocated for a config that would not fit
        try:
            skeleton = AutoModelForCausalLM.from_config(config)
        except Exception as exc:  # noqa: BLE001  (as above: whatever a hostile config makes the constructors raise)
            raise AttachError(
                f"{path / 'config.json'} describes no buildable {kind} model ({str(exc)[:300]})"
            ) from None
    check_size(sum(p.numel() for p in skeleton.parameters()), f"{path} ({kind})")
    why = why_not(skeleton)
    del skeleton
    if why is not None:
        raise AttachError(f"{path}: {why}")
    weights = list(path.glob("*.safetensors"))
    if not weights:
        found = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        raise AttachError(
            f"{path} holds no .safetensors weights"
            + (f" ({', '.join(found)} are pickle files, which multihead does not open)" if found else "")
            + "; save the model with save_pretrained(..., safe_serialization=True)"
        )
    tok_info = _folder_tokenizer(path, hf)  # checked against the embeddings before the weights are read
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, use_safetensors=True, dtype=torch.float32
        )
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as exc:
        raise AttachError(f"{path}: transformers cannot read the weights ({str(exc).splitlines()[0][:300]})") from None
    attach(model.eval(), backend=backend)
    pad = getattr(config, "pad_token_id", None)
    wrapper = AttachedLM(model, pad if isinstance(pad, int) and 0 <= pad < config.vocab_size else 0)
    return bundle(str(path), path, wrapper, hf, f"hf:{kind}", tok_info, device)


__all__ = ["AttachedLM", "load", "why_not_folder"]
