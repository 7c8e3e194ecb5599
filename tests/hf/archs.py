"""Small random-weight HF models of 30 architectures, built from configs (no download), with inputs of batch 1 and
the tensor one forward pass returns. Shared by the attach tests and `multihead bench peers`' coverage row."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

E, H, L, FF, V, P = 64, 4, 2, 128, 128, 64  # width, heads, layers, MLP width, vocabulary, positions
DEC = {"hidden_size": E, "num_attention_heads": H, "num_hidden_layers": L, "intermediate_size": FF}
GQA = {**DEC, "num_key_value_heads": 2}
TOK = {"vocab_size": V, "max_position_embeddings": P}


@dataclass(frozen=True)
class Arch:
    model_type: str
    kind: str  # causal, encoder, seq2seq, vision, multimodal, speech
    config: dict = field(default_factory=dict)
    gqa: bool = False

    def build(self, implementation: str = "sdpa"):
        """The model with random weights (seed 0: every build has the same), in ``implementation`` where the
        architecture has it (HF's default, sdpa, is the reference the attached outputs are compared with; eager
        gives the maps: some architectures cannot switch to it after they are built)."""
        import transformers as T

        cfg = self._config(T)
        cls = {
            "causal": T.AutoModelForCausalLM,
            "seq2seq": T.AutoModelForSeq2SeqLM,
            "speech": T.AutoModelForSpeechSeq2Seq,
        }.get(self.kind, T.AutoModel)
        torch.manual_seed(0)
        try:
            model = cls.from_config(cfg, attn_implementation=implementation)
        except (ValueError, ImportError):  # the architecture has eager attention only (the failed call set it)
            torch.manual_seed(0)
            model = cls.from_config(self._config(T))
        return model.eval()

    def _config(self, T):
        if self.model_type == "clip":
            return T.CLIPConfig(
                text_config={**DEC, **TOK, "projection_dim": 32},
                vision_config={**DEC, "image_size": 32, "patch_size": 8, "projection_dim": 32},
                projection_dim=32,
            )
        return T.AutoConfig.for_model(self.model_type, **self.config)

    def inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, V, (1, 10), generator=g)
        if self.kind in ("causal", "encoder"):
            return (ids,)
        if self.kind == "seq2seq":
            return ids, torch.randint(3, V, (1, 6), generator=g)
        if self.kind == "vision":
            return (torch.randn(1, 3, 32, 32, generator=g),)
        if self.kind == "multimodal":
            return ids, torch.randn(1, 3, 32, 32, generator=g)
        mel = self.config.get("num_mel_bins", 80)
        return torch.randn(1, mel, 2 * self.config["max_source_positions"], generator=g), torch.randint(
            3, V, (1, 6), generator=g
        )

    def run(self, model, inputs, **kw):
        """The model's output object on ``inputs`` (a tuple of batch tensors)."""
        if self.kind in ("causal", "encoder"):
            return model(input_ids=inputs[0], **kw)
        if self.kind == "seq2seq":
            return model(input_ids=inputs[0], decoder_input_ids=inputs[1], **kw)
        if self.kind == "vision":
            return model(pixel_values=inputs[0], **kw)
        if self.kind == "multimodal":
            return model(input_ids=inputs[0], pixel_values=inputs[1], **kw)
        return model(input_features=inputs[0], decoder_input_ids=inputs[1], **kw)

    def tensor(self, out) -> torch.Tensor:
        """The output compared: logits, or the last hidden state (CLIP: both towers' embeddings)."""
        if self.kind == "multimodal":
            return torch.cat([out.text_embeds, out.image_embeds], -1)
        t = getattr(out, "logits", None)
        return t if t is not None else out.last_hidden_state


ENC = {**DEC, **TOK}
S2S = {
    "vocab_size": V,
    "d_model": E,
    "encoder_layers": L,
    "decoder_layers": L,
    "encoder_attention_heads": H,
    "decoder_attention_heads": H,
    "encoder_ffn_dim": FF,
    "decoder_ffn_dim": FF,
    "max_position_embeddings": P,
}
ARCHS = {
    a.model_type: a
    for a in (
        Arch("llama", "causal", {**GQA, **TOK}, gqa=True),
        Arch("mistral", "causal", {**GQA, **TOK, "sliding_window": 4}, gqa=True),
        Arch("mixtral", "causal", {**GQA, **TOK, "num_local_experts": 2}, gqa=True),
        Arch("qwen2", "causal", {**GQA, **TOK}, gqa=True),
        Arch("qwen3", "causal", {**GQA, **TOK, "head_dim": 16}, gqa=True),
        Arch("gemma2", "causal", {**GQA, **TOK, "head_dim": 16, "sliding_window": 4}, gqa=True),
        Arch("gemma3_text", "causal", {**GQA, **TOK, "head_dim": 16, "sliding_window": 4}, gqa=True),
        Arch("phi", "causal", {**DEC, **TOK}),
        Arch("phi3", "causal", {**GQA, **TOK, "pad_token_id": 0}, gqa=True),
        Arch("gpt_neox", "causal", {**DEC, **TOK}),
        Arch("olmo2", "causal", {**GQA, **TOK}, gqa=True),
        Arch("starcoder2", "causal", {**GQA, **TOK}, gqa=True),
        Arch("stablelm", "causal", {**GQA, **TOK}, gqa=True),
        Arch("falcon", "causal", {"hidden_size": E, "num_attention_heads": H, "num_hidden_layers": L, **TOK}),
        Arch("gptj", "causal", {"n_embd": E, "n_head": H, "n_layer": L, "rotary_dim": 8, "vocab_size": V}),
        Arch(
            "opt",
            "causal",
            {**DEC, "ffn_dim": FF, "word_embed_proj_dim": E, "vocab_size": V, "max_position_embeddings": P},
        ),
        Arch("bloom", "causal", {"hidden_size": E, "n_head": H, "n_layer": L, "vocab_size": V}),
        Arch("cohere", "causal", {**GQA, **TOK}, gqa=True),
        Arch("granite", "causal", {**GQA, **TOK}, gqa=True),
        Arch("gpt2", "causal", {"n_embd": E, "n_head": H, "n_layer": L, "vocab_size": V, "n_positions": P}),
        Arch("gpt_bigcode", "causal", {"n_embd": E, "n_head": H, "n_layer": L, "vocab_size": V, "n_positions": P}),
        Arch("bert", "encoder", ENC),
        Arch("roberta", "encoder", {**ENC, "pad_token_id": 1}),
        Arch("distilbert", "encoder", {"dim": E, "n_heads": H, "n_layers": L, "hidden_dim": FF, **TOK}),
        Arch("electra", "encoder", {**ENC, "embedding_size": E}),
        Arch(
            "t5",
            "seq2seq",
            {"vocab_size": V, "d_model": E, "d_kv": 16, "num_heads": H, "num_layers": L, "d_ff": FF},
        ),
        Arch("bart", "seq2seq", S2S),
        Arch("marian", "seq2seq", {**S2S, "decoder_vocab_size": V, "pad_token_id": 0}),
        Arch("vit", "vision", {**DEC, "image_size": 32, "patch_size": 8}),
        Arch("dinov2", "vision", {**DEC, "image_size": 32, "patch_size": 8}),
        Arch("clip", "multimodal"),
        Arch(
            "whisper",
            "speech",
            {
                **S2S,
                "num_mel_bins": 16,
                "max_source_positions": 8,
                "max_target_positions": P,
                "decoder_start_token_id": 1,
                "pad_token_id": 0,
                "bos_token_id": 1,
                "eos_token_id": 2,
            },
        ),
    )
}
