"""Test helper: a Hugging Face fixture folder written as GGUF the way llama.cpp's
converter lays it out (its tensor names, ggml shapes, Llama q/k rows permuted for the
interleaved rotary, GPT-2's Conv1D weights as out x in, 1 added to Gemma's norm weights,
Phi-3's fused projections as they are and its longrope factors as tensors, the metadata
keys each architecture's converter writes), quantised as asked."""

import json
import math
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

from beyondpar.benchmarks.gguf_models import llama_metadata
from beyondpar.benchmarks.reference_gguf import LLAMA_PARTS

GEMMA_PARTS = {
    **LLAMA_PARTS,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
PHI3_PARTS = {**LLAMA_PARTS, "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
# model_type -> GGUF name (llama.cpp writes Mistral as llama with its sliding window)
ARCHITECTURE = {"gemma3_text": "gemma3", "gemma3": "gemma3", "mistral": "llama"}
# A Gemma 3 text model inside a multimodal checkpoint (transformers 5, 4.x layouts).
TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model."}
TEXT_PREFIXES["language_model.lm_head."] = "lm_head."
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
    for stored, text in TEXT_PREFIXES.items():
        if name.startswith(stored):
            name = text + name.removeprefix(stored)
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
    parts = {"gpt2": GPT2_PARTS, "gemma2": GEMMA_PARTS, "gemma3": GEMMA_PARTS, "phi3": PHI3_PARTS}
    return f"blk.{layer}.{parts.get(arch, LLAMA_PARTS)['.'.join(rest)]}.{leaf}"


def skipped(name: str, arch: str) -> bool:
    """Tensors the text model's converter leaves out: GPT-2's mask buffers, a multimodal
    checkpoint's vision tower and projector, Gemma 2's lm_head (it is the embedding)."""
    if name.endswith((".attn.bias", ".attn.masked_bias")):
        return True
    if any(part in name for part in ("vision_tower.", "multi_modal_projector.")):
        return True
    return arch == "gemma2" and name == "lm_head.weight"


def export(
    folder: Path, path: Path, qtype=gguf.GGMLQuantizationType.F32, pre="gpt-2", extra=None
) -> Path:
    """`extra(writer)`, when given, adds metadata after the converter's."""
    config = json.loads((folder / "config.json").read_text())
    arch = ARCHITECTURE.get(config["model_type"], config["model_type"])
    config = {**config, **(config.get("text_config") or {})}  # as the converter merges it
    writer = gguf.GGUFWriter(path, arch)
    _metadata(writer, config, arch)
    if extra is not None:
        extra(writer)
    _tokenizer(writer, json.loads((folder / "tokenizer.json").read_text()), pre)
    for name, array in sorted(load_file(folder / "model.safetensors").items()):
        if skipped(name, arch):
            continue
        target = gguf_name(name, arch)
        if arch in ("gemma2", "gemma3") and target.endswith("norm.weight"):
            array = array + np.float32(1.0)
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
    own = {"gemma2": _gemma2_metadata, "gemma3": _gemma3_metadata, "phi3": _phi3_metadata}
    if arch in own:
        own[arch](writer, c)
        return
    if arch == "gpt2":
        writer.add_context_length(c["n_positions"])
        writer.add_embedding_length(c["n_embd"])
        writer.add_block_count(c["n_layer"])
        writer.add_feed_forward_length(c.get("n_inner") or 4 * c["n_embd"])
        writer.add_head_count(c["n_head"])
        writer.add_layer_norm_eps(c["layer_norm_epsilon"])
        return
    llama_metadata(writer, c)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    if c.get("sliding_window"):
        writer.add_sliding_window(c["sliding_window"])
    if c["rope_parameters"].get("rope_type") == "llama3":
        factors = llama3_factors(c["rope_parameters"], head_dim)
        writer.add_tensor("rope_freqs.weight", factors)


def _gemma2_metadata(writer, c: dict) -> None:
    """Gemma2Model.set_gguf_parameters: no rope base (llama.cpp's 10000), no
    query_pre_attn_scalar (llama.cpp scales by key_length), no sliding pattern (2)."""
    llama_metadata(writer, c)
    writer.add_key_length(c["head_dim"])
    writer.add_value_length(c["head_dim"])
    writer.add_attn_logit_softcapping(c["attn_logit_softcapping"])
    writer.add_final_logit_softcapping(c["final_logit_softcapping"])
    writer.add_sliding_window(c["sliding_window"])


def _gemma3_metadata(writer, c: dict) -> None:
    """Gemma3Model.set_gguf_parameters over TextModel's: rope bases of full and sliding
    layers and the full layers' linear factor; no pattern (llama.cpp's 6)."""
    llama_metadata(writer, c)
    writer.add_key_length(c.get("head_dim", 256))
    writer.add_value_length(c.get("head_dim", 256))
    full, sliding = gemma3_ropes(c)
    if full.get("rope_type", full.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    writer.add_rope_freq_base(full.get("rope_theta", 1e6))
    writer.add_rope_freq_base_swa(sliding.get("rope_theta", 1e4))
    if c.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(c["final_logit_softcapping"])
    if c.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(c["sliding_window"])


def gemma3_ropes(c: dict) -> tuple[dict, dict]:
    """(full, sliding) rope dicts of a Gemma 3 config, new style or old."""
    rope = c.get("rope_parameters")
    if rope is not None:
        return rope["full_attention"], rope["sliding_attention"]
    full = {**(c.get("rope_scaling") or {}), "rope_theta": c.get("rope_theta", 1e6)}
    return full, {"rope_theta": c.get("rope_local_base_freq", 1e4)}


def _phi3_metadata(writer, c: dict) -> None:
    """Phi3MiniModel.set_gguf_parameters and generate_extra_tensors: rotary dims as
    int(factor * hidden) // heads, window 0 when none, longrope factors as tensors with
    the attention factor from max / original positions."""
    llama_metadata(writer, c)
    rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
    heads, original = c["num_attention_heads"], c.get("original_max_position_embeddings", 4096)
    factor = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(int(factor * c["hidden_size"]) // heads)
    writer.add_rope_freq_base(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
    writer.add_sliding_window(c.get("sliding_window") or 0)
    if rope.get("long_factor"):
        scale = c["max_position_embeddings"] / original
        attn = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        writer.add_rope_scaling_attn_factors(attn)
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))


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
