"""Pretrained checkpoints (GPT-2, GPT-NeoX/Pythia, Llama, Mistral, Qwen2, Qwen3) in JAX.

`load` reads a Hugging Face folder (config.json, safetensors weights, tokenizer.json) or
a GGUF file (llama.cpp, Ollama), without torch or transformers; `apply_with_attention`
returns logits and every layer's attention like `beyondpar.model.apply_with_attention`,
with the same head mask; `layer_by_layer` yields one layer's attention at a time, for
texts too long to keep every layer's T x T maps.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Iterator
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import model as model_lib
from beyondpar.pretrained import files, gguf_file, gpt2, gpt_neox, llama

FAMILIES: dict[str, ModuleType] = {
    kind: fam for fam in (gpt2, gpt_neox, llama) for kind in fam.MODEL_TYPES
}


def family(module) -> ModuleType:
    """The family module (gpt2, gpt_neox, llama) a Flax model class comes from."""
    return importlib.import_module(type(module).__module__)


def build(config: dict):
    """The Flax module a config.json describes."""
    kind = config.get("model_type")
    if kind not in FAMILIES:
        raise ValueError(
            f"config.json field 'model_type' must be one of {sorted(FAMILIES)}, got {kind!r}"
        )
    return FAMILIES[kind].build(config)


def load(path_or_name: str | os.PathLike, dtype=None):
    """(module, params, tokenizer) of a local checkpoint folder, a cached model name, or a
    GGUF file (or a folder holding one).

    Parameters keep the checkpoint's dtype unless `dtype` is given (GGUF tensors are
    dequantised to float32); every tensor's shape is checked against the config.
    """
    gguf_path = gguf_file.find(path_or_name)
    if gguf_path is not None:
        return load_gguf(gguf_path, dtype)
    folder = files.resolve(path_or_name)
    module = build(files.read_config(folder))
    tokenizer = files.read_tokenizer(folder)
    shards = files.shard_files(folder)
    prefix = _prefix(module, shards)
    params = _read_params(
        module, set(shards), lambda names: files.read_tensors(shards, names), dtype, prefix
    )
    return module, params, tokenizer


def load_gguf(path: str | os.PathLike, dtype=None):
    """(module, params, tokenizer) of a GGUF file, dequantised tensor by tensor."""
    source = gguf_file.GgufFile(gguf_file.find(path) or _not_gguf(path))
    module = build(source.config())
    tokenizer = source.tokenizer()
    names = source.hf_names()
    params = _read_params(module, set(names), source.read_tensors, dtype, "")
    return module, params, tokenizer


def _not_gguf(path):
    raise ValueError(f"path must be a GGUF file or a folder holding one, got {str(path)!r}")


def _prefix(module, names) -> str:
    """GPT-2 checkpoints saved from GPT2LMHeadModel name the body `transformer.*` (and may
    add an unprefixed `lm_head.weight`); the original `gpt2` upload has no prefix."""
    if not isinstance(module, gpt2.Gpt2):
        return ""
    return "transformer." if any(n.startswith("transformer.h.") for n in names) else ""


def _read_params(module, available: set, read, dtype, prefix: str) -> dict:
    """Parameters named as `module` wants them; `read(names)` yields (name, array) one at a
    time, so only one tensor beyond the parameters themselves is alive at once."""
    fam = family(module)
    like = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), int)))
    wanted = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(like["params"]):
        keys = tuple(p.key for p in path)
        name, transpose = fam.hf_name(keys)
        wanted[prefix + name] = (keys, transpose, tuple(leaf.shape))
    missing = [n for n in wanted if n not in available]
    if missing:
        raise ValueError(f"checkpoint is missing tensors {missing[:5]} (of {len(missing)})")
    flat = {}
    for name, array in read(list(wanted)):
        keys, transpose, shape = wanted[name]
        array = array.T if transpose else array
        if array.shape != shape:
            raise ValueError(f"tensor {name!r} must have shape {shape}, got {array.shape}")
        flat[keys] = jnp.asarray(array, dtype=dtype)
    return _unflatten(flat)


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for keys, value in flat.items():
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return out


def check_tokens(module, tokens_BxT) -> np.ndarray:
    tokens = np.asarray(tokens_BxT)
    if tokens.ndim != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must have shape (B, T) with T >= 1, got {tokens.shape}")
    cfg = module.config
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(
            f"text must be at most the model's context of {cfg.max_len} tokens, "
            f"got {tokens.shape[1]}"
        )
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(
            f"token ids must be in [0, {cfg.vocab_size}), got [{tokens.min()}, {tokens.max()}]"
        )
    return tokens_BxT if isinstance(tokens_BxT, jax.Array) else tokens  # keeps a sharding


def check_head_mask(module, head_mask):
    """A head mask as float32 (L, H) or (B, L, H) with entries in [0, 1]; None stays None.
    The same rules as the paper's model (`beyondpar.model.check_head_mask`)."""
    if head_mask is None:
        return None
    return model_lib.check_head_mask(head_mask, module.config).astype(jnp.float32)


def apply_with_attention(module, params, tokens_BxT, head_mask=None):
    """Logits (B, T, V) and float32 attention of every layer and query head (B, L, H, T, T).

    `head_mask` (L, H) or per sequence (B, L, H) scales each head's output before its
    layer's output projection (0 removes the head); None leaves the model as is.
    """
    tokens = check_tokens(module, tokens_BxT)
    return _apply(module, params, tokens, check_head_mask(module, head_mask))


@functools.partial(jax.jit, static_argnums=0)
def _apply(module, params, tokens, head_mask=None):
    logits, state = module.apply(
        {"params": params}, tokens, head_mask=head_mask, mutable=["intermediates"]
    )
    blocks = state["intermediates"]
    attn = [blocks[layer_name(module, i)]["attention"][0] for i in range(module.config.num_layers)]
    return logits, jnp.stack(attn, axis=1)


def layer_name(module, index: int) -> str:
    return f"{module.layer_prefix}_{index}"


def layer_by_layer(module, params, tokens_BxT, head_mask=None) -> Iterator[tuple[int, jax.Array]]:
    """Yield (layer, attention B x H x T x T) one layer at a time, then return the logits
    (as StopIteration.value): only one layer's T x T maps are alive at once."""
    tokens = check_tokens(module, tokens_BxT)
    mask = check_head_mask(module, head_mask)
    x = _embed(module, params, tokens)
    for i in range(module.config.num_layers):
        block = family(module).block_module(module.config, i)
        layer_mask = None if mask is None else mask[..., i, :]
        x, attn = _block(block, params[layer_name(module, i)], x, layer_mask)
        yield i, attn
    return _unembed(module, params, x)


@functools.partial(jax.jit, static_argnums=0)
def _embed(module, params, tokens):
    return module.apply({"params": params}, tokens, method="embed")


@functools.partial(jax.jit, static_argnums=0)
def _unembed(module, params, x):
    return module.apply({"params": params}, x, method="unembed")


@functools.partial(jax.jit, static_argnums=0)
def _block(block, params, x, head_mask=None):
    out, state = block.apply({"params": params}, x, head_mask, mutable=["intermediates"])
    return out, state["intermediates"]["attention"][0]
