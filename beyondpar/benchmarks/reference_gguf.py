"""The reference GGUF reader: the load suite's speed baseline and the loader tests' oracle.

Plain and independent of the loader (`pretrained.gguf_file`): the `gguf` package reads
the header and dequantises one tensor at a time from the memory map into a float32 host
copy (`gguf.quants.dequantize`); the Hugging Face name of every tensor, the Llama q/k
row order and the config are written out below from the conventions of llama.cpp's
converter (`convert_hf_to_gguf.py`), the other way round from the loader's, so a test
that compares the two checks them; the whole network's init is traced for the parameter
shapes; every tensor goes to the default device as it comes. This is how the package
loaded a GGUF file before its own header reader and kernels: the load suite times the
two in the same run.

Llama-family files only (architectures llama, qwen2, qwen3), what the benchmark times;
a file whose metadata would change the model beyond what is read here (a sliding window,
rope scaling, partial rotary) is refused. The tokenizer is the package's own
(`GgufFile.tokenizer`): this reader is a reference for the weights and the config.
"""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import pretrained
from beyondpar.pretrained import gguf_file

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Hugging Face module of a layer (after `model.layers.N.`) -> its GGUF name (after
# `blk.N.`), as llama.cpp's converter renames a Llama-family model's tensors.
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
# The tensors outside the layers, by their full names.
LLAMA_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# Metadata (after `<arch>.`) that would change the model and is not read here (nor is
# the tensor `rope_freqs.weight`, Llama 3's rope divisors).
UNREAD = ("attention.sliding_window", "rope.scaling.type", "rope.scaling.factor")


def gguf_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face Llama-family tensor: `model.layers.3.mlp.up_proj
    .weight` is `blk.3.ffn_up.weight`."""
    if hf_name in LLAMA_TOP:
        return LLAMA_TOP[hf_name]
    model, layers, layer, *module, leaf = hf_name.split(".")
    if (model, layers) != ("model", "layers") or ".".join(module) not in LLAMA_PARTS:
        raise ValueError(f"tensor {hf_name!r} must be a Llama-family tensor, got no GGUF name")
    return f"blk.{layer}.{LLAMA_PARTS['.'.join(module)]}.{leaf}"


def hf_row_order(rows: int, heads: int) -> np.ndarray:
    """The stored row of each Hugging Face row of a Llama q or k projection of `heads`
    heads. Hugging Face pairs row i of a head with row i + d/2 for the rotary (the two
    halves); llama.cpp's converter (`permute`) stores each pair side by side, as rows
    2i and 2i + 1 of the head."""
    d = rows // heads
    order = []
    for head in range(heads):
        first_half = [head * d + 2 * i for i in range(d // 2)]
        second_half = [head * d + 2 * i + 1 for i in range(d // 2)]
        order += first_half + second_half
    return np.array(order)


class ReferenceGguf:
    """One GGUF file of a Llama-family model, read by the `gguf` package."""

    def __init__(self, path):
        self.path = path
        self.reader = gguf.GGUFReader(path)
        self.arch = self.value("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise ValueError(
                f"GGUF file {path}: general.architecture must be one of {list(ARCHITECTURES)}, "
                f"got {self.arch!r}"
            )
        self.tensors = {t.name: t for t in self.reader.tensors}
        unread = [key for key in UNREAD if f"{self.arch}.{key}" in self.reader.fields]
        unread += [name for name in ("rope_freqs.weight",) if name in self.tensors]
        if unread:
            raise ValueError(f"GGUF file {path} must hold none of {unread} (not read here)")

    def value(self, key: str, default=...):
        """The metadata `key`; `default` when the file has none."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"GGUF file {self.path} must hold metadata {key!r}, got none")
            return default
        return field.contents()

    def config(self) -> dict:
        """The config.json of the model, from the metadata llama.cpp's converter writes."""
        arch, heads = self.arch, self.value(f"{self.arch}.attention.head_count")
        hidden = self.value(f"{arch}.embedding_length")
        head_dim = self.value(f"{arch}.attention.key_length", hidden // heads)
        if self.value(f"{arch}.rope.dimension_count", head_dim) != head_dim:
            raise ValueError(f"GGUF file {self.path} must turn every feature of a head")
        return {
            "model_type": arch,
            "vocab_size": len(self.value("tokenizer.ggml.tokens")),
            "max_position_embeddings": self.value(f"{arch}.context_length"),
            "hidden_size": hidden,
            "num_hidden_layers": self.value(f"{arch}.block_count"),
            "intermediate_size": self.value(f"{arch}.feed_forward_length"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.value(f"{arch}.attention.head_count_kv", heads),
            "head_dim": head_dim,
            "rms_norm_eps": self.value(f"{arch}.attention.layer_norm_rms_epsilon"),
            "rope_theta": self.value(f"{arch}.rope.freq_base", 10000.0),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": "blk.0.attn_q.bias" in self.tensors,
        }

    def read(self, hf_name: str, transpose: bool) -> np.ndarray:
        """A tensor in its Hugging Face layout (Linear weights out x in), or transposed."""
        name = gguf_name(hf_name)
        tensor = self.tensors[name]
        kind = gguf.GGMLQuantizationType(tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml lists columns first
        values = gguf.quants.dequantize(tensor.data, kind).reshape(shape)
        values = np.ascontiguousarray(values, dtype=np.float32)
        part = name.split(".")[-2]
        if self.arch == "llama" and part in ("attn_q", "attn_k"):  # the converter's permute
            heads = self.value(f"{self.arch}.attention.head_count")
            if part == "attn_k":
                heads = self.value(f"{self.arch}.attention.head_count_kv", heads)
            values = values[hf_row_order(len(values), heads)]
        return values.T if transpose else values


def load(path, dtype=None):
    """(module, params, tokenizer) of a Llama-family GGUF file, read one tensor at a time."""
    source = ReferenceGguf(path)
    module = pretrained.build(source.config())
    tokenizer = gguf_file.GgufFile(path).tokenizer()
    family = pretrained.family(module)
    like = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), int)))
    params: dict = {}
    for path_, leaf in jax.tree_util.tree_leaves_with_path(like["params"]):
        keys = tuple(p.key for p in path_)
        name, transpose = family.hf_name(keys)
        array = source.read(name, transpose)
        if array.shape != tuple(leaf.shape):
            raise ValueError(f"tensor {name!r} must have shape {leaf.shape}, got {array.shape}")
        node = params
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = jnp.asarray(array, dtype=dtype)
    return module, params, tokenizer
