"""The GGUF loading path this package had before its own header reader and kernels, kept
to be timed against in the same run: the `gguf` package's reader for the header, its
NumPy dequantisation one tensor at a time from the memory map, float32 host copies,
transposes and the Llama q/k row order on the host, the whole network's init traced for
the parameter shapes, and every tensor put on the default device as it comes."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from beyondpar.pretrained import gguf_file, loading
from beyondpar.pretrained.gguf import tokenizer as gguf_tokenizer


class PreviousGgufFile(gguf_file.GgufFile):
    """A GgufFile whose header comes from `gguf.GGUFReader` and whose tensors come from
    `gguf.quants.dequantize`, as before (Llama-family files: what the benchmark times)."""

    workers = 1

    def __init__(self, path):  # noqa: D107 - the parent's header reader is bypassed
        self.path = path
        self.reader = gguf.GGUFReader(path)
        self.arch = self.value("general.architecture")
        self.tensors = {t.name: t for t in self.reader.tensors}

    def value(self, key: str, default=...):
        field = self.reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"GGUF file {self.path} must hold metadata {key!r}, got none")
            return default
        return field.contents()

    def dequantize(self, name: str) -> np.ndarray:
        tensor = self.tensors[name]
        flat = gguf.quants.dequantize(tensor.data, gguf.GGMLQuantizationType(tensor.tensor_type))
        shape = tuple(int(n) for n in reversed(tensor.shape))
        return np.ascontiguousarray(flat.reshape(shape), dtype=np.float32)

    def read(self, hf_name: str, transpose: bool, dtype=None) -> np.ndarray:
        name = self._hf_names[hf_name]
        values = self.dequantize(name)
        order = self._row_order(name, values.shape[0])
        values = values if order is None else values[order]
        return values.T if transpose else values


def load(path, dtype=None):
    """(module, params, tokenizer) the way the package loaded a GGUF file before."""
    source = PreviousGgufFile(gguf_file.find(path))
    module = loading.build(source.config())
    tokenizer = gguf_tokenizer.build(source)
    fam = loading.family(module)
    like = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), int)))
    flat = {}
    for path_, leaf in jax.tree_util.tree_leaves_with_path(like["params"]):
        keys = tuple(p.key for p in path_)
        name, transpose = fam.hf_name(keys)
        array = source.read(name, transpose)
        if array.shape != tuple(leaf.shape):
            raise ValueError(f"tensor {name!r} must have shape {leaf.shape}, got {array.shape}")
        flat[keys] = jnp.asarray(array, dtype=dtype)
    params: dict = {}
    for keys, value in flat.items():
        node = params
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return module, params, tokenizer
