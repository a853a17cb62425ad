"""Loading: a Hugging Face folder or a GGUF file -> (Flax module, parameters, tokenizer).

One path for every family: a GGUF file's metadata becomes the config.json the family
reads, and every tensor is named as Hugging Face names it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import jax
import jax.numpy as jnp

from beyondpar.pretrained import files, gemma, gguf_file, gpt2, gpt_neox, llama, phi3

FAMILIES: dict[str, ModuleType] = {
    kind: fam for fam in (gpt2, gpt_neox, llama, gemma, phi3) for kind in fam.MODEL_TYPES
}


def family(module) -> ModuleType:
    """The family module (gpt2, gpt_neox, llama, gemma, phi3) a Flax model class comes from."""
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
    layouts = getattr(family(module), "CHECKPOINT_PREFIXES", ({},))
    read = lambda names: files.read_tensors(shards, names)
    return module, _read_params(module, set(shards), read, dtype, layouts), tokenizer


def load_gguf(path: str | os.PathLike, dtype=None):
    """(module, params, tokenizer) of a GGUF file, dequantised tensor by tensor."""
    source = gguf_file.GgufFile(gguf_file.find(path) or _not_gguf(path))
    module = build(source.config())
    tokenizer = source.tokenizer()
    names = source.hf_names()
    params = _read_params(module, set(names), source.read_tensors, dtype, ({},))
    return module, params, tokenizer


def _not_gguf(path):
    raise ValueError(f"path must be a GGUF file or a folder holding one, got {str(path)!r}")


def _stored_names(names: list[str], available: set, layouts) -> list[str]:
    """The checkpoint's name of every Hugging Face name: under the family's layout (name
    prefixes renamed, e.g. GPT-2's `transformer.` or a Gemma 3 text model inside its
    multimodal checkpoint) that finds the most of them; the first layout on a tie."""

    def rename(name: str, layout: dict) -> str:
        for hf, stored in layout.items():
            if name.startswith(hf):
                return stored + name.removeprefix(hf)
        return name

    candidates = [[rename(n, layout) for n in names] for layout in layouts]
    return max(candidates, key=lambda stored: sum(n in available for n in stored))


def _read_params(module, available: set, read, dtype, layouts) -> dict:
    """Parameters named as `module` wants them; `read(names)` yields (name, array) one at a
    time, so only one tensor beyond the parameters themselves is alive at once."""
    fam = family(module)
    like = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), int)))
    leaves = jax.tree_util.tree_leaves_with_path(like["params"])
    keys = [tuple(p.key for p in path) for path, _ in leaves]
    names, transposes = zip(*(fam.hf_name(k) for k in keys), strict=True)
    stored = _stored_names(list(names), available, layouts)
    wanted = {
        name: (k, transpose, tuple(leaf.shape))
        for name, k, transpose, (_, leaf) in zip(stored, keys, transposes, leaves, strict=True)
    }
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
