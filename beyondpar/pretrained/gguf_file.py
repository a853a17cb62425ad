"""GGUF files (llama.cpp, Ollama, LM Studio) read into the Hugging Face layout.

The metadata becomes the config.json the family modules already read, every tensor gets
its Hugging Face name and layout (Linear weights stay out x in; llama.cpp's row
permutation of Llama q/k for its interleaved rotary is undone); the tokenizer is rebuilt
from the stored vocabulary and merges with `tokenizers` (see `gguf_tokenizer`). The
header is read in one pass (`gguf_header`); tensors stay in the memory map until read,
then are dequantised by jitted kernels straight into the layout and dtype asked for
(`gguf_quants`), the permutation and any transpose folded in.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from beyondpar.pretrained import gguf_header, gguf_quants, gguf_tokenizer

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gpt2")
_LLAMA_LIKE = ("llama", "qwen2", "qwen3")

_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GPT2_BLOCK = {
    "attn_norm": "ln_1",
    "attn_qkv": "attn.c_attn",
    "attn_output": "attn.c_proj",
    "ffn_norm": "ln_2",
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}
_GPT2_TOP = {"token_embd": "wte", "position_embd": "wpe", "output_norm": "ln_f"}
_CONV1D = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")  # GPT-2 stores these in x out
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_TOP = re.compile(r"^(\w+)\.(weight|bias)$")


def find(path: str | os.PathLike) -> Path | None:
    """The GGUF file of a path (a .gguf file, an Ollama blob, or a folder holding exactly
    one .gguf), or None when the path is not one."""
    path = Path(path).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ValueError(f"folder {path} must hold one .gguf file, got {len(found)}")
        return found[0] if found else None
    if path.is_file() and (path.suffix == ".gguf" or gguf_header.is_gguf(path)):
        return path
    return None


class GgufFile:
    """One opened GGUF file: metadata, Hugging Face config, tensors, tokenizer."""

    # Threads reading tensors: one per core, at most 8 (each holds one tensor in flight).
    _cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    workers = min(8, len(_cores) if _cores else os.cpu_count() or 1)

    def __init__(self, path: Path):
        self.path = path
        try:
            self.header = gguf_header.read(path)
        except (gguf_header.HeaderError, OSError) as err:
            message = f"GGUF file {path} cannot be read (damaged or cut short?): {err}"
            raise ValueError(message) from err
        self.arch = self.value("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise ValueError(
                f"GGUF file {path}: general.architecture must be one of {list(ARCHITECTURES)}, "
                f"got {self.arch!r}"
            )
        self.tensors = self.header.tensors

    def value(self, key: str, default=...):
        if key not in self.header.metadata:
            if default is ...:
                raise ValueError(f"GGUF file {self.path} must hold metadata {key!r}, got none")
            return default
        return self.header.metadata[key]

    def arch_value(self, key: str, default=...):
        return self.value(f"{self.arch}.{key}", default)

    # ------------------------------------------------------------------ config

    def config(self) -> dict:
        """The config.json a Hugging Face folder of this model would hold."""
        if self.arch == "gpt2":
            return self._gpt2_config()
        heads = self.arch_value("attention.head_count")
        embed = self.arch_value("embedding_length")
        head_dim = self.arch_value("attention.key_length", embed // heads)
        rotary = self.arch_value("rope.dimension_count", head_dim)
        scaling = self.arch_value("rope.scaling.type", "none")
        if scaling not in ("none", "linear") or (
            scaling == "linear" and self.arch_value("rope.scaling.factor", 1.0) != 1.0
        ):
            raise ValueError(
                f"GGUF file {self.path}: {self.arch}.rope.scaling.type must be 'none', "
                f"got {scaling!r}"
            )
        config = {
            "model_type": self.arch,
            "vocab_size": self.arch_value("vocab_size", len(self.value("tokenizer.ggml.tokens"))),
            "max_position_embeddings": self.arch_value("context_length"),
            "hidden_size": embed,
            "num_hidden_layers": self.arch_value("block_count"),
            "intermediate_size": self.arch_value("feed_forward_length"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.arch_value("attention.head_count_kv", heads),
            "head_dim": head_dim,
            "rms_norm_eps": self.arch_value("attention.layer_norm_rms_epsilon"),
            "rope_theta": self.arch_value("rope.freq_base", 10000.0),
            "partial_rotary_factor": rotary / head_dim,
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": self.arch == "llama" and "blk.0.attn_q.bias" in self.tensors,
        }
        window = self.arch_value("attention.sliding_window", None)
        if window:
            config["sliding_window"] = window
            config["model_type"] = "mistral" if self.arch == "llama" else self.arch
            config["use_sliding_window"] = True
        if "rope_freqs.weight" in self.tensors:
            config["rope_freq_factors"] = self._dequantize("rope_freqs.weight").tolist()
        return config

    def _gpt2_config(self) -> dict:
        return {
            "model_type": "gpt2",
            "vocab_size": self.arch_value("vocab_size", len(self.value("tokenizer.ggml.tokens"))),
            "n_positions": self.arch_value("context_length"),
            "n_embd": self.arch_value("embedding_length"),
            "n_layer": self.arch_value("block_count"),
            "n_head": self.arch_value("attention.head_count"),
            "n_inner": self.arch_value("feed_forward_length"),
            "layer_norm_epsilon": self.arch_value("attention.layer_norm_epsilon"),
            "activation_function": "gelu_new",
        }

    # ----------------------------------------------------------------- tensors

    def hf_names(self) -> dict[str, str]:
        """Hugging Face name -> GGUF name of every tensor the model reads."""
        out = {}
        block, top = (_GPT2_BLOCK, _GPT2_TOP) if self.arch == "gpt2" else (_LLAMA_BLOCK, _LLAMA_TOP)
        prefix = "h" if self.arch == "gpt2" else "model.layers"
        for name in self.tensors:
            if m := _BLOCK.match(name):
                layer, part, leaf = m.groups()
                if part in block:
                    out[f"{prefix}.{layer}.{block[part]}.{leaf}"] = name
            elif (m := _TOP.match(name)) and m.group(1) in top:
                out[f"{top[m.group(1)]}.{m.group(2)}"] = name
        return out

    def read_tensors(self, hf_names, dtype=None) -> Iterator[tuple[str, np.ndarray]]:
        """(Hugging Face name, array in its layout), dequantised one tensor at a time."""
        for hf in hf_names:
            yield hf, np.asarray(self.read(hf, transpose=False, dtype=dtype))

    def read(self, hf_name: str, transpose: bool, dtype=None):
        """One tensor in its Hugging Face layout, or transposed (a Flax Dense kernel), in
        `dtype` (default float32), dequantised straight into that layout: a jax.Array on
        the host's CPU device, or a NumPy array."""
        gguf_name = self._hf_names[hf_name]
        info = self.tensors[gguf_name]
        rows, cols = info.rows_cols
        stored_transposed = self.arch == "gpt2" and _block_part(gguf_name) in _CONV1D
        flip = transpose != stored_transposed
        dtype = np.float32 if dtype is None else jnp.dtype(dtype)
        order = self._row_order(gguf_name, rows)
        values = self._decode(info, cols, flip, dtype, order)
        shape = tuple(reversed(info.shape))
        return values.reshape(shape[::-1] if flip else shape)

    @functools.cached_property
    def _hf_names(self) -> dict[str, str]:
        return self.hf_names()

    @functools.cached_property
    def _compiled(self) -> set:
        """The (type, rows, cols) whose tensors hold enough values to compile for."""
        totals: dict = {}
        for info in self.tensors.values():
            key = (info.tensor_type, *info.rows_cols)
            totals[key] = totals.get(key, 0) + info.n_elements
        return {key for key, values in totals.items() if gguf_quants.worth_compiling(values)}

    def _decode(self, info, cols: int, transpose: bool, dtype, order=None):
        kind = info.tensor_type
        compiled = (kind, *info.rows_cols) in self._compiled
        try:
            raw = self.header.raw(info)
            return gguf_quants.decode(raw, kind, cols, transpose, dtype, order, compiled)
        except NotImplementedError as err:
            raise ValueError(
                f"GGUF file {self.path}: tensor {info.name!r} has quantisation type "
                f"{kind.name}, which the gguf package cannot dequantise ({err})"
            ) from err
        except Exception as err:
            message = f"GGUF file {self.path}: tensor {info.name!r} cannot be read: {err}"
            raise ValueError(message) from err

    def _dequantize(self, name: str) -> np.ndarray:
        """A tensor's float32 values in the file's own layout (NumPy order)."""
        info = self.tensors[name]
        values = self._decode(info, info.rows_cols[1], False, np.dtype(np.float32))
        return np.asarray(values).reshape(tuple(reversed(info.shape)))

    def _row_order(self, name: str, rows: int) -> np.ndarray | None:
        """Llama q/k rows in Hugging Face's order: llama.cpp stores each head's rows as
        interleaved pairs (for its rotary), Hugging Face as two halves."""
        part = _block_part(name)
        if self.arch != "llama" or part not in ("attn_q", "attn_k"):
            return None
        heads = self.arch_value("attention.head_count")
        if part == "attn_k":
            heads = self.arch_value("attention.head_count_kv", heads)
        return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)

    # --------------------------------------------------------------- tokenizer

    def tokenizer(self):
        """A `tokenizers.Tokenizer` that gives the model's own token ids."""
        return gguf_tokenizer.build(self)


def _block_part(name: str) -> str | None:
    """`attn_q` of `blk.3.attn_q.weight`; None for tensors outside the blocks."""
    m = _BLOCK.match(name)
    return m.group(2) if m else None
