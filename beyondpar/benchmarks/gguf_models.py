"""GGUF files of a real model's shape with random weights, written once for a benchmark:
Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads on 2 kv heads, MLP 4864, vocabulary
151,936, q/k/v biases, untied head) with llama.cpp's Q4_K_M mix of types, and a
byte-level BPE vocabulary and merges of the real size, so that reading the header costs
what it costs for the real file. `llama_metadata` is the Llama family's metadata as
llama.cpp's converter writes it, for these files and the tests' exporter alike."""

from __future__ import annotations

import logging
import os

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES

from beyondpar.pretrained.gguf.quants import FLOAT16_FIELDS

Q = gguf.GGMLQuantizationType
# The writer logs every file it writes at INFO; not news in a benchmark.
logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)

QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the layers Q4_K_M gives 6-bit attn_v and ffn_down."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(part: str, layer: int, layers: int, cols: int) -> Q:
    """The type llama.cpp's Q4_K_M gives a weight matrix: Q6_K for the output, and for
    attn_v and ffn_down on `more_bits` layers, else Q4_K; rows that are no multiple of
    256 values fall back to Q8_0 (for Q6_K) and Q5_0 (for Q4_K)."""
    wide = part == "output" or (part in ("attn_v", "ffn_down") and more_bits(layer, layers))
    if cols % 256:
        return Q.Q8_0 if wide else Q.Q5_0
    return Q.Q6_K if wide else Q.Q4_K


def random_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random raw blocks (uint8, rows x bytes per row): random bits, with every
    float16 scale a small finite number (random bits there would give NaN and inf)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F32, Q.F16):
        values = rng.normal(0, 0.02, (rows, cols))
        return values.astype(np.float32 if qtype == Q.F32 else np.float16).view(np.uint8)
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for offset in FLOAT16_FIELDS[qtype]:
        scales = np.abs(rng.normal(0, 1e-3, (raw.shape[0], 1))).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def byte_level_vocabulary(size: int, specials: int = 3, seed: int = 0):
    """(tokens, merges, token types) of a byte-level BPE vocabulary of `size` tokens: the
    256 byte symbols, tokens made by merging two earlier ones, and `specials` control
    tokens at the end; a valid tokenizer, of the real size."""
    rng = np.random.default_rng(seed)
    tokens = list(_byte_symbols())
    known = set(tokens)
    merges = []
    while len(tokens) < size - specials:
        a, b = (tokens[int(i)] for i in rng.integers(0, min(len(tokens), 4096), 2))
        if a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    tokens += [f"<|special_{i}|>" for i in range(specials)]
    types = [1] * (size - specials) + [3] * specials
    return tokens, merges, types


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b if b in printable else next(extra)) for b in range(256)]


def write_qwen2_gguf(path: str | os.PathLike, config: dict | None = None, seed: int = 0):
    """Write a `qwen2` GGUF file of `config`'s shape (default Qwen2.5-0.5B) with random
    weights in the Q4_K_M mix, one tensor at a time; returns {type name: tensors}."""
    c = dict(QWEN25_05B if config is None else config)
    writer = gguf.GGUFWriter(path, "qwen2")
    _metadata(writer, c, seed)
    tensors = list(_tensor_plan(c))
    for name, qtype, rows, cols in tensors:
        block, size = GGML_QUANT_SIZES[qtype]
        shape, nbytes = (rows, cols) if rows > 1 else (cols,), rows * cols // block * size
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, qtype, rows, cols in tensors:
        if name.endswith("norm.weight"):
            raw = (1 + rng.normal(0, 0.05, (rows, cols))).astype(np.float32).view(np.uint8)
        else:
            raw = random_blocks(qtype, rows, cols, rng)
        writer.write_tensor_data(raw)
    writer.close()
    counts: dict[str, int] = {}
    for _, qtype, _, _ in tensors:
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return counts


def llama_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    """The sizes of a Llama-family Hugging Face `config` as llama.cpp's converter writes
    them (`TextModel.set_gguf_parameters`): context, widths, layers, heads (kv heads
    default to the query heads) and the RMS norm's epsilon, under `<arch>.`."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])


def _metadata(writer, c: dict, seed: int) -> None:
    llama_metadata(writer, c)
    writer.add_rope_freq_base(c["rope_theta"])
    tokens, merges, types = byte_level_vocabulary(c["vocab_size"], seed=seed)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)


def _tensor_plan(c: dict):
    """(name, type, rows, cols) of every tensor, in llama.cpp's order."""
    d, ff, layers, vocab = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )
    kv = d // c["num_attention_heads"] * c["num_key_value_heads"]
    yield "token_embd.weight", q4_k_m_type("token_embd", 0, layers, d), vocab, d
    for i in range(layers):
        matrices = [("attn_q", d, d), ("attn_k", kv, d), ("attn_v", kv, d), ("attn_output", d, d)]
        matrices += [("ffn_gate", ff, d), ("ffn_up", ff, d), ("ffn_down", d, ff)]
        yield f"blk.{i}.attn_norm.weight", Q.F32, 1, d
        for part, rows, cols in matrices:
            yield f"blk.{i}.{part}.weight", q4_k_m_type(part, i, layers, cols), rows, cols
        for part, rows in (("attn_q", d), ("attn_k", kv), ("attn_v", kv)):
            yield f"blk.{i}.{part}.bias", Q.F32, 1, rows
        yield f"blk.{i}.ffn_norm.weight", Q.F32, 1, d
    yield "output_norm.weight", Q.F32, 1, d
    yield "output.weight", q4_k_m_type("output", 0, layers, d), vocab, d
