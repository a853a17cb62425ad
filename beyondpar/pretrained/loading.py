"""Loading: a Hugging Face folder or a GGUF file -> (Flax module, parameters, tokenizer).

One path for every family: a GGUF file's metadata becomes the config.json the family
reads, and every tensor is named as Hugging Face names it (a family's checkpoint name
layouts, such as GPT-2's `transformer.` prefix or a Gemma 3 text model inside its
multimodal checkpoint, are found by name). Parameters go straight onto a `data` x
`model` mesh (by default 1 x 1: one device), each device receiving only its part of
each tensor; the tensors are read by a few threads at a time, largest first.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import math
import os
from types import ModuleType

import jax
import jax.numpy as jnp
import tqdm
from jax.sharding import NamedSharding

from beyondpar.base import checks, parallel
from beyondpar.pretrained import gemma, gpt2, gpt_neox, hf_folder, llama, phi3, sharding
from beyondpar.pretrained.gguf import reader as gguf_reader

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


def layer_name(module, index: int) -> str:
    return f"{module.layer_prefix}_{index}"


def load(path_or_name: str | os.PathLike, dtype=None, mesh=None, progress: bool = True):
    """(module, params, tokenizer) of a local checkpoint folder, a cached model name, or a
    GGUF file (or a folder holding one).

    Parameters keep the checkpoint's dtype unless `dtype` is given (GGUF tensors are
    dequantised to float32); every tensor's shape is checked against the config. `mesh`
    (`parallel.model_mesh`; default 1 x 1 on the first device) spreads them over devices;
    `progress` shows a bar over the parameters read (on a terminal).
    """
    gguf_path = gguf_reader.find(path_or_name)
    if gguf_path is not None:
        return load_gguf(gguf_path, dtype, mesh, progress)
    folder = hf_folder.resolve(path_or_name)
    module = build(hf_folder.read_config(folder))
    tokenizer = hf_folder.read_tokenizer(folder)
    shards = hf_folder.shard_files(folder)
    layouts = getattr(family(module), "CHECKPOINT_PREFIXES", ({},))
    with hf_folder.Safetensors(shards) as source:
        params, _ = read_params(module, source, set(shards), dtype, mesh, progress, layouts)
    return module, params, tokenizer


def load_gguf(path: str | os.PathLike, dtype=None, mesh=None, progress: bool = True):
    """(module, params, tokenizer) of a GGUF file, dequantised tensor by tensor."""
    source = gguf_reader.GgufFile(gguf_reader.find(path) or _not_gguf(path))
    config = source.config()
    try:
        module = build(config)
    except ValueError as err:
        raise source.config_error(err) from err
    available = set(source.hf_names())
    params, tokenizer = read_params(
        module, source, available, dtype, mesh, progress, alongside=source.tokenizer
    )
    return module, params, tokenizer


FINGERPRINT_SAMPLE_BYTES = 1 << 20


def fingerprint(path_or_name: str | os.PathLike) -> str:
    """SHA-256 over the files `load` reads (a GGUF file; a folder's config, tokenizer and
    weight files): each one's name in the folder, size, and first and last MiB.

    A run resumed on a model changed in place (re-quantised, fine-tuned, another model
    copied over it, a cache name whose snapshot moved) sees another fingerprint, without
    reading every byte of a large model; a GGUF file is the same model under any name."""
    gguf_path = gguf_reader.find(path_or_name)
    if gguf_path is not None:
        named = [(b"", gguf_path)]
    else:
        folder = hf_folder.resolve(path_or_name)
        weights = sorted(set(hf_folder.shard_files(folder).values()))
        read = [folder / hf_folder.CONFIG, folder / hf_folder.TOKENIZER, *weights]
        named = [(p.name.encode(), p) for p in read]
    digest = hashlib.sha256()
    for name, path in named:
        size = path.stat().st_size
        digest.update(name + b"\0" + str(size).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read(FINGERPRINT_SAMPLE_BYTES))
            f.seek(max(size - FINGERPRINT_SAMPLE_BYTES, 0))
            digest.update(f.read(FINGERPRINT_SAMPLE_BYTES))
    return digest.hexdigest()


def _not_gguf(path):
    raise checks.path_error(
        path, f"path must be a GGUF file or a folder holding one, got {str(path)!r}"
    )


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


def parameter_shapes(module) -> dict[tuple[str, ...], tuple[int, ...]]:
    """{parameter path: shape} of a model, traced one distinct block at a time (tracing
    the whole network's init takes a second for 30 layers, one block a few ms), on
    abstract inputs (a concrete key or array would compile XLA code to make it)."""
    cfg = module.config
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    x = jax.ShapeDtypeStruct((1, 1, cfg.embed_dim), jnp.float32)
    traced = {}
    for method, arg in (("embed", tokens), ("unembed", x)):
        init = lambda k, a, m=method: module.init(k, a, method=m)["params"]  # noqa: E731
        traced.update(jax.eval_shape(init, key, arg))
    blocks: dict = {}
    for i in range(cfg.num_layers):
        block = family(module).block_module(cfg, i)
        if block not in blocks:
            blocks[block] = jax.eval_shape(lambda k, a, b=block: b.init(k, a)["params"], key, x)
        traced[layer_name(module, i)] = blocks[block]
    leaves = jax.tree_util.tree_leaves_with_path(traced)
    return {tuple(p.key for p in path): tuple(leaf.shape) for path, leaf in leaves}


def read_params(
    module, source, available: set, dtype, mesh, progress: bool, layouts=({},), alongside=None
):
    """(parameters named as `module` wants them, `alongside()`).

    Tensors are read from `source` (`read(name, transpose, dtype, order)`, `workers`) by
    `source.workers` threads, largest first, each placed on `mesh` by its
    `sharding.partition_spec` as soon as it is read: at most `workers` tensors are alive
    beyond the parameters themselves. `layouts` are the family's checkpoint name layouts
    (`_stored_names`); `order` the rows a family keeps in its own order (`row_order`).
    `alongside` (the tokenizer) runs on the same threads; its error, like a tensor's,
    stops the load.
    """
    wanted = _wanted(module, available, layouts)
    mesh = parallel.model_mesh() if mesh is None else mesh
    model_size = mesh.shape[parallel.MODEL]
    dtype = None if dtype is None else jnp.dtype(dtype)

    def read_one(name):
        keys, transpose, shape, order = wanted[name]
        host = source.read(name, transpose, dtype, order=order)
        if host.shape != shape:
            raise ValueError(f"tensor {name!r} must have shape {shape}, got {host.shape}")
        spec = sharding.partition_spec(keys, len(shape), module.config, model_size)
        return keys, parallel.place(host, NamedSharding(mesh, spec))

    largest_first = sorted(wanted, key=lambda n: -math.prod(wanted[n][2]))
    flat = {}
    bar = _bar(sum(math.prod(wanted[n][2]) for n in largest_first), progress)
    with bar, concurrent.futures.ThreadPoolExecutor(source.workers + 1) as pool:
        extra = pool.submit(alongside or (lambda: None))
        futures = [extra] + [pool.submit(read_one, n) for n in largest_first]
        try:
            for done in concurrent.futures.as_completed(futures):
                if done is not extra:
                    keys, array = done.result()
                    flat[keys] = array
                    bar.update(math.prod(array.shape))
                done.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return _unflatten(flat), extra.result()


def _wanted(module, available: set, layouts) -> dict:
    """{checkpoint name: (parameter path, transpose?, shape, row order or None)}; a
    missing tensor is named."""
    fam = family(module)
    shapes = parameter_shapes(module)
    names, transposes = zip(*(fam.hf_name(keys) for keys in shapes), strict=True)
    stored = _stored_names(list(names), available, layouts)
    row_order = getattr(fam, "row_order", lambda keys, config: None)
    wanted = {
        name: (keys, transpose, shape, row_order(keys, module.config))
        for name, (keys, shape), transpose in zip(stored, shapes.items(), transposes, strict=True)
    }
    missing = [n for n in wanted if n not in available]
    if missing:
        raise ValueError(f"checkpoint is missing tensors {missing[:5]} (of {len(missing)})")
    return wanted


def _bar(total: int, progress: bool):
    """A bar over the parameter values read, on a terminal only (tqdm's disable=None):
    a log or a captured stream gets no bar lines; erased when done."""
    return tqdm.tqdm(
        total=total,
        unit="param",
        unit_scale=True,
        desc="load",
        leave=False,
        disable=None if progress else True,
    )


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for keys, value in sorted(flat.items()):
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return out
