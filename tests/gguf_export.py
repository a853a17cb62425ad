"""Test helper: a Hugging Face fixture folder written as GGUF the way llama.cpp's
converter lays it out (its tensor names, ggml shapes, Llama q/k rows permuted for the
interleaved rotary, GPT-2's Conv1D weights as out x in), quantised as asked."""

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

LLAMA_PARTS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GPT2_PARTS = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}


def permute(weights, heads):
    """llama.cpp's `permute`: each head's two halves -> interleaved pairs."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_name(name: str, arch: str) -> str:
    name = name.removeprefix("transformer.").removeprefix("model.")
    *body, leaf = name.split(".")
    body = ".".join(body)
    top = {
        "embed_tokens": "token_embd",
        "norm": "output_norm",
        "lm_head": "output",
        "wte": "token_embd",
        "wpe": "position_embd",
        "ln_f": "output_norm",
    }
    if body in top:
        return f"{top[body]}.{leaf}"
    _, layer, *rest = body.split(".")
    parts = GPT2_PARTS if arch == "gpt2" else LLAMA_PARTS
    return f"blk.{layer}.{parts['.'.join(rest)]}.{leaf}"


def export(folder: Path, path: Path, qtype=gguf.GGMLQuantizationType.F32, pre="gpt-2") -> Path:
    config = json.loads((folder / "config.json").read_text())
    arch = {"mistral": "llama"}.get(config["model_type"], config["model_type"])  # as llama.cpp
    writer = gguf.GGUFWriter(path, arch)
    _metadata(writer, config, arch)
    _tokenizer(writer, json.loads((folder / "tokenizer.json").read_text()), pre)
    for name, array in sorted(load_file(folder / "model.safetensors").items()):
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        target = gguf_name(name, arch)
        if arch == "gpt2" and array.ndim == 2 and "blk." in target:
            array = array.T  # Conv1D in x out -> out x in
        if arch == "llama" and ".attn_q." in target:
            array = permute(array, config["num_attention_heads"])
        if arch == "llama" and ".attn_k." in target:
            heads = config.get("num_key_value_heads", config["num_attention_heads"])
            array = permute(array, heads)
        kind = qtype if array.ndim == 2 else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(np.ascontiguousarray(array, np.float32), kind)
        writer.add_tensor(target, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _metadata(writer, c: dict, arch: str) -> None:
    if arch == "gpt2":
        writer.add_context_length(c["n_positions"])
        writer.add_embedding_length(c["n_embd"])
        writer.add_block_count(c["n_layer"])
        writer.add_feed_forward_length(c.get("n_inner") or 4 * c["n_embd"])
        writer.add_head_count(c["n_head"])
        writer.add_layer_norm_eps(c["layer_norm_epsilon"])
        return
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c.get("num_key_value_heads", c["num_attention_heads"]))
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    if c.get("sliding_window"):
        writer.add_sliding_window(c["sliding_window"])
    if c["rope_parameters"].get("rope_type") == "llama3":
        factors = llama3_factors(c["rope_parameters"], head_dim)
        writer.add_tensor("rope_freqs.weight", factors)


def llama3_factors(rope: dict, head_dim: int) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter stores for `llama3` rope scaling."""
    original = rope["original_max_position_embeddings"]
    low, high = original / rope["low_freq_factor"], original / rope["high_freq_factor"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * rope["rope_theta"] ** (i / head_dim)
        if wavelen < high:
            factors.append(1.0)
        elif wavelen > low:
            factors.append(rope["factor"])
        else:
            smooth = (
                rope["original_max_position_embeddings"] / wavelen - rope["low_freq_factor"]
            ) / (rope["high_freq_factor"] - rope["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.asarray(factors, np.float32)


def _tokenizer(writer, tok: dict, pre: str) -> None:
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_add_bos_token(False)
