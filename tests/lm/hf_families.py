"""Random-weight HF causal LMs of each family (small configs, no package needed), saved to a folder, and GGUF files
written from them with the ``gguf`` package's own writer."""

from __future__ import annotations

import numpy as np
import torch

SMALL = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _theta(c) -> float:
    """The rotary base of an HF config of either transformers line (5.x keeps it in rope_parameters)."""
    theta = getattr(c, "rope_theta", None)
    if theta is None:
        params = c.rope_parameters
        theta = (params.get("full_attention") or params)["rope_theta"]
    return float(theta)


def hf_model(family: str, **overrides):
    """A small random HF model of ``family``, its weights (biases and norms included) moved away from their init so
    that a missed bias or norm shows."""
    import transformers as T

    if family == "gpt2":
        config = T.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128, **overrides)
        model = T.GPT2LMHeadModel(config)
    elif family == "gemma3":  # 6 layers: five with a sliding window of 8 keys, the sixth global
        config = T.Gemma3TextConfig(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            query_pre_attn_scalar=32,
            max_position_embeddings=128,
            sliding_window=8,
            rope_theta=1e6,
            rope_local_base_freq=1e4,
            **overrides,
        )
        model = T.Gemma3ForCausalLM(config)
    else:
        options = {
            "llama": dict(
                rope_theta=1e5,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 4.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
            ),
            "qwen2": dict(tie_word_embeddings=True),
            "qwen3": dict(head_dim=24),
            "mistral": dict(sliding_window=None),
        }[family]
        cls_config, cls_model = {
            "llama": (T.LlamaConfig, T.LlamaForCausalLM),
            "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
            "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM),
            "mistral": (T.MistralConfig, T.MistralForCausalLM),
        }[family]
        model = cls_model(cls_config(**{**SMALL, **options, **overrides}))
    model.config._attn_implementation = "eager"  # HF returns attentions only from eager attention
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def byte_bpe(vocab_size: int = 290):
    """A small byte-level BPE (GPT-2 style) trained on a few sentences: its tokens and merges."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    text = ["the cat sat on the mat", "attention heads read the past", "a model of 12 heads and 3 layers"] * 20
    tok.train_from_iterator(text, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    import json

    spec = json.loads(tok._tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])], merges


def write_gguf(model, path, *, permute: bool = True, quantize: tuple = (), arch: str = "llama", **meta):
    """``model`` (an HF Llama-family model) as a llama GGUF file, as llama.cpp's converter writes one: q/k rows
    permuted for adjacent-pair rotary (unless ``permute=False``), tensors named ``blk.N.*``; tensors whose GGUF name
    ends with one of ``quantize`` are stored Q8_0."""
    import gguf

    from multihead.lm.gguf_file import permute as perm

    c = model.config
    tokens, merges = byte_bpe()
    tokens += [f"<|unused{i}|>" for i in range(c.vocab_size - len(tokens))]
    types = [3 if t.startswith("<|") else 1 for t in tokens]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(meta.get("layers", c.num_hidden_layers))
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(_theta(c))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}")
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name in names:
            out = names[name]
        else:
            parts = name.split(".")
            out = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        t = t.detach().float()
        if permute and out.endswith("attn_q.weight"):
            t = perm(t, c.num_attention_heads)
        elif permute and out.endswith("attn_k.weight"):
            t = perm(t, c.num_key_value_heads)
        if "shape" in meta and out == meta["shape"][0]:
            t = torch.zeros(meta["shape"][1])
        array = t.numpy().astype(np.float32)
        if out.endswith(tuple(quantize)):
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(out, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(out, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_gemma_gguf(model, path):
    """A random HF Gemma 3 model as llama.cpp writes a gemma3 GGUF: norms stored as ``1 + weight``, no q/k
    permutation, a SentencePiece vocabulary (tokens, scores, byte tokens) with BOS added."""
    import gguf

    c = model.config
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)]
    words = ["▁the", "▁cat", "▁sat", "▁on", "▁mat", "▁a", "t", "h", "e", "c", "a", "s", "o", "n", "m", "▁"]
    pieces += words + [f"<unused{i}>" for i in range(c.vocab_size - len(pieces) - len(words))]
    pieces = pieces[: c.vocab_size]
    scores = [0.0] * 260 + [-float(i) for i in range(len(pieces) - 260)]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * (len(pieces) - 260)
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(_theta(c))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_sliding_window(c.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        else:
            parts = name.split(".")
            out = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        t = t.detach().float()
        if out.endswith("norm.weight"):
            t = t + 1.0
        w.add_tensor(out, t.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
