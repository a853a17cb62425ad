"""GGUF files (llama.cpp, Ollama, LM Studio) read into the Hugging Face layout.

The metadata becomes the config.json the family modules already read, each family
translating its own architectures' metadata (`gguf_config`): what the file
records is read; what it does not (Gemma's query_pre_attn_scalar, its sliding pattern
when no key holds it) is what llama.cpp assumes for the architecture. Every tensor gets
its Hugging Face name and layout (Linear weights stay out x in). The header is read in
one pass (`header`); tensors stay in the memory map until read, then are
dequantised by jitted kernels straight into the layout and dtype asked for
(`quants`), every fix-up folded in: llama.cpp's row permutation of Llama q/k (for
its interleaved rotary) undone, the 1 its converter adds to Gemma's norm weights taken
off, the rows in a family's own order (Phi-3's fused projections, grouped), any
transpose. The tokenizer is rebuilt from the stored vocabulary and merges with
`tokenizers` (see `tokenizer`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from beyondpar.base import checks
from beyondpar.pretrained import gemma, gpt2, hf_folder, llama, phi3
from beyondpar.pretrained.gguf import header, quants, tokenizer

# architecture -> the family module that translates its metadata into a config.json
_FAMILIES = {
    **dict.fromkeys(("llama", "qwen2", "qwen3"), llama),
    "gpt2": gpt2,
    **dict.fromkeys(("gemma2", "gemma3"), gemma),
    "phi3": phi3,
}
ARCHITECTURES = tuple(_FAMILIES)
_GEMMA = ("gemma2", "gemma3")
# config.json field -> the metadata (after `<arch>.`) it is read from.
_CONFIG_KEYS = {
    **dict.fromkeys(("hidden_size", "n_embd"), "embedding_length"),
    **dict.fromkeys(("num_hidden_layers", "n_layer"), "block_count"),
    **dict.fromkeys(("intermediate_size", "n_inner"), "feed_forward_length"),
    **dict.fromkeys(("num_attention_heads", "n_head"), "attention.head_count"),
    **dict.fromkeys(("max_position_embeddings", "n_positions"), "context_length"),
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "layer_norm_epsilon": "attention.layer_norm_epsilon",
    "rope_theta": "rope.freq_base",
    "sliding_window": "attention.sliding_window",
}
# Metadata that counts something (as config.json's sizes do): an integer >= 1 when given.
_COUNTS = frozenset(
    ("attention.head_count", "attention.head_count_kv", "attention.key_length")
    + ("block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size")
)

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
_GEMMA_BLOCK = {
    **_LLAMA_BLOCK,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_PHI3_BLOCK = {**_LLAMA_BLOCK, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_GPT2_BLOCK = {
    "attn_norm": "ln_1",
    "attn_qkv": "attn.c_attn",
    "attn_output": "attn.c_proj",
    "ffn_norm": "ln_2",
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}
_GPT2_TOP = {
    "token_embd": "wte",
    "position_embd": "wpe",
    "output_norm": "ln_f",
    "output": "lm_head",
}
_NAMES = {  # architecture -> (block parts, top-level tensors, block prefix)
    "gpt2": (_GPT2_BLOCK, _GPT2_TOP, "h"),
    "gemma2": (_GEMMA_BLOCK, _LLAMA_TOP, "model.layers"),
    "gemma3": (_GEMMA_BLOCK, _LLAMA_TOP, "model.layers"),
    "phi3": (_PHI3_BLOCK, _LLAMA_TOP, "model.layers"),
}
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
    if path.is_file() and (path.suffix == ".gguf" or header.is_gguf(path)):
        return path
    return None


class GgufFile:
    """One opened GGUF file: metadata, Hugging Face config, tensors, tokenizer."""

    # Threads reading tensors: one per core, at most 8 (each holds one tensor in flight).
    _cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    workers = min(8, len(_cores) if _cores else os.cpu_count() or 1)

    def __init__(self, path: Path):
        self.path = path
        if not Path(path).is_file():
            raise checks.path_error(path, f"path must be an existing GGUF file, got {str(path)!r}")
        try:
            self.header = header.read(path)
        except (header.HeaderError, OSError) as err:
            message = f"GGUF file {path} cannot be read (damaged or cut short?): {err}"
            raise ValueError(message) from err
        self.arch = checks.one_of(
            f"GGUF file {path}: general.architecture",
            self.value("general.architecture"),
            list(ARCHITECTURES),
        )
        self.tensors = self.header.tensors

    def value(self, key: str, default=...):
        if key not in self.header.metadata:
            if default is ...:
                raise ValueError(f"GGUF file {self.path} must hold metadata {key!r}, got none")
            return default
        return self.header.metadata[key]

    def arch_value(self, key: str, default=...):
        """`<arch>.<key>`; a count (`_COUNTS`) the file holds must be an integer >= 1."""
        name = f"{self.arch}.{key}"
        value = self.value(name, default)
        if key in _COUNTS and self.value(name, None) is not None:
            checks.positive_int(f"GGUF file {self.path}: metadata {name!r}", value)
        return value

    def config_error(self, err: ValueError) -> ValueError:
        """`err` of a family reading `config()`, worded for this file: a config.json field
        is named by the metadata key it is read from."""

        def key(match) -> str:
            stored = _CONFIG_KEYS.get(match.group(1))
            return (
                f"metadata '{self.arch}.{stored}'" if stored else f"config field {match.group(1)!r}"
            )

        text = re.sub(r"config\.json field '(\w+)'", key, str(err))
        text = text.replace("config.json", "the config its metadata gives")
        return ValueError(f"GGUF file {self.path}: {text}")

    # ------------------------------------------------------------------ config

    def config(self) -> dict:
        """The config.json a Hugging Face folder of this model would hold, as its family
        module translates the metadata (`gguf_config`)."""
        return _FAMILIES[self.arch].gguf_config(self)

    def decoder_config(self) -> dict:
        """The fields every decoder-only architecture here shares, where each family's
        `gguf_config` starts."""
        heads = self.arch_value("attention.head_count")
        embed = self.arch_value("embedding_length")
        head_dim = self.arch_value("attention.key_length", embed // heads)
        rotary = self.arch_value("rope.dimension_count", head_dim)
        return {
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
            "rope_scaling": self._linear_rope_scaling(),
            "partial_rotary_factor": rotary / head_dim,
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": self.arch == "llama" and "blk.0.attn_q.bias" in self.tensors,
        }

    def _linear_rope_scaling(self) -> dict | None:
        """`rope.scaling.factor` (linear unless `rope.scaling.type` says otherwise, as
        llama.cpp reads it) as Hugging Face's rope dict: Gemma's full layers take it, other
        architectures here only a factor of 1 (Phi-3's longrope is in its tensors)."""
        factor = self.arch_value("rope.scaling.factor", 1.0)
        scaling = self.arch_value("rope.scaling.type", "linear" if factor != 1.0 else "none")
        if scaling == "none" or (scaling == "linear" and factor == 1.0):
            return None
        if scaling == "linear" and self.arch in _GEMMA:
            return {"rope_type": "linear", "factor": factor}
        if scaling == "longrope" and self.arch == "phi3":
            return None
        allowed = {"gemma2": "'none' or 'linear'", "gemma3": "'none' or 'linear'"}
        allowed["phi3"] = "'none' or 'longrope'"
        raise ValueError(
            f"GGUF file {self.path}: {self.arch}.rope.scaling.type must be "
            f"{allowed.get(self.arch, repr('none'))}, got {scaling!r} with factor {factor}"
        )

    # ----------------------------------------------------------------- tensors

    def hf_names(self) -> dict[str, str]:
        """Hugging Face name -> GGUF name of every tensor the model reads."""
        out = {}
        block, top, prefix = _NAMES.get(self.arch, (_LLAMA_BLOCK, _LLAMA_TOP, "model.layers"))
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

    def read(self, hf_name: str, transpose: bool, dtype=None, order=None):
        """One tensor in its Hugging Face layout, or transposed (a Flax Dense kernel), in
        `dtype` (default float32), its rows in `order` when given (a family's own layout
        of a fused tensor), dequantised straight into that layout with the file's own
        fix-ups (`_row_order`, `_offset`): a jax.Array on the host's CPU device, or a
        NumPy array."""
        gguf_name = self._hf_names[hf_name]
        info = self.tensors[gguf_name]
        rows, cols = info.rows_cols
        stored_transposed = self.arch == "gpt2" and _block_part(gguf_name) in _CONV1D
        flip = transpose != stored_transposed
        dtype = np.float32 if dtype is None else jnp.dtype(dtype)
        rows_in = self._row_order(gguf_name, rows)
        if order is not None:
            if stored_transposed:  # its Hugging Face rows are the file's columns
                raise ValueError(f"tensor {hf_name!r} is stored transposed: no row order")
            hf_folder.check_rows(hf_name, order, rows)
            rows_in = np.asarray(order) if rows_in is None else rows_in[order]
        values = self._decode(info, cols, flip, dtype, rows_in, self._offset(gguf_name))
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
        return {key for key, values in totals.items() if quants.worth_compiling(values)}

    def _decode(self, info, cols: int, transpose: bool, dtype, order=None, offset=0.0):
        kind = info.tensor_type
        compiled = (kind, *info.rows_cols) in self._compiled
        try:
            raw = self.header.raw(info)
            return quants.decode(raw, kind, cols, transpose, dtype, order, compiled, offset)
        except NotImplementedError as err:
            raise ValueError(
                f"GGUF file {self.path}: tensor {info.name!r} has quantisation type "
                f"{kind.name}, which the gguf package cannot dequantise ({err})"
            ) from err
        except Exception as err:
            message = f"GGUF file {self.path}: tensor {info.name!r} cannot be read: {err}"
            raise ValueError(message) from err

    def dequantize(self, name: str) -> np.ndarray:
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

    def _offset(self, name: str) -> float:
        """What to add to a tensor's stored values: llama.cpp's converter stores Gemma's
        norm weights (q/k norms too) as 1 + weight."""
        return -1.0 if self.arch in _GEMMA and name.endswith("norm.weight") else 0.0

    # --------------------------------------------------------------- tokenizer

    def tokenizer(self):
        """A `tokenizers.Tokenizer` that gives the model's own token ids."""
        return tokenizer.build(self)


def _block_part(name: str) -> str | None:
    """`attn_q` of `blk.3.attn_q.weight`; None for tensors outside the blocks."""
    m = _BLOCK.match(name)
    return m.group(2) if m else None
