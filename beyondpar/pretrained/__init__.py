"""Hugging Face checkpoints (GPT-2, Llama, Mistral, Qwen2) read from local files into JAX.

`load` reads config.json, safetensors weights and tokenizer.json, without torch or
transformers; `apply_with_attention` returns logits and every layer's attention like
`beyondpar.model.apply_with_attention`; `layer_by_layer` yields one layer's attention at a
time, for texts too long to keep every layer's T x T maps.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar.pretrained import files, gpt2, llama

FAMILIES: dict[str, ModuleType] = {"gpt2": gpt2, **{kind: llama for kind in llama.MODEL_TYPES}}
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def family(module) -> ModuleType:
    return gpt2 if isinstance(module, gpt2.Gpt2) else llama


def build(config: dict):
    """The Flax module a config.json describes."""
    kind = config.get("model_type")
    if kind not in FAMILIES:
        raise ValueError(
            f"config.json field 'model_type' must be one of {sorted(FAMILIES)}, got {kind!r}"
        )
    if kind == "gpt2":
        return gpt2.Gpt2(gpt2.Gpt2Config.from_hf(config))
    return llama.Llama(llama.LlamaConfig.from_hf(config))


def load(path_or_name: str | os.PathLike, dtype=None):
    """(module, params, tokenizer) of a local checkpoint folder or a cached model name.

    Parameters keep the checkpoint's dtype unless `dtype` is given; every tensor's shape is
    checked against the config.
    """
    folder = files.resolve(path_or_name)
    module = build(files.read_config(folder))
    tokenizer = files.read_tokenizer(folder)
    params = _read_params(module, files.shard_files(folder), dtype)
    return module, params, tokenizer


def _read_params(module, shards: dict, dtype) -> dict:
    fam = family(module)
    like = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), int)))
    prefix = "transformer." if any(n.startswith("transformer.") for n in shards) else ""
    names = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(like["params"]):
        keys = tuple(p.key for p in path)
        name, transpose = fam.hf_name(keys)
        names[keys] = (prefix + name, transpose, leaf.shape)
    wanted = [n for n, _, _ in names.values()]
    missing = [n for n in wanted if n not in shards]
    if missing:
        raise ValueError(f"checkpoint is missing tensors {missing[:5]} (of {len(missing)})")
    tensors = files.read_tensors(shards, wanted)
    flat = {}
    for keys, (name, transpose, shape) in names.items():
        array = tensors.pop(name)
        array = array.T if transpose else array
        if array.shape != tuple(shape):
            raise ValueError(f"tensor {name!r} must have shape {tuple(shape)}, got {array.shape}")
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
    return tokens


def apply_with_attention(module, params, tokens_BxT):
    """Logits (B, T, V) and float32 attention of every layer and query head (B, L, H, T, T)."""
    return _apply(module, params, check_tokens(module, tokens_BxT))


@functools.partial(jax.jit, static_argnums=0)
def _apply(module, params, tokens):
    logits, state = module.apply({"params": params}, tokens, mutable=["intermediates"])
    blocks = state["intermediates"]
    attn = [blocks[layer_name(module, i)]["attention"][0] for i in range(module.config.num_layers)]
    return logits, jnp.stack(attn, axis=1)


def layer_name(module, index: int) -> str:
    return f"{module.layer_prefix}_{index}"


def layer_by_layer(module, params, tokens_BxT) -> Iterator[tuple[int, jax.Array]]:
    """Yield (layer, attention B x H x T x T) one layer at a time, then return the logits
    (as StopIteration.value): only one layer's T x T maps are alive at once."""
    tokens = check_tokens(module, tokens_BxT)
    x = _embed(module, params, tokens)
    for i in range(module.config.num_layers):
        block = family(module).block_module(module.config, i)
        x, attn = _block(block, params[layer_name(module, i)], x)
        yield i, attn
    return _unembed(module, params, x)


@functools.partial(jax.jit, static_argnums=0)
def _embed(module, params, tokens):
    return module.apply({"params": params}, tokens, method="embed")


@functools.partial(jax.jit, static_argnums=0)
def _unembed(module, params, x):
    return module.apply({"params": params}, x, method="unembed")


@functools.partial(jax.jit, static_argnums=0)
def _block(block, params, x):
    out, state = block.apply({"params": params}, x, mutable=["intermediates"])
    return out, state["intermediates"]["attention"][0]
