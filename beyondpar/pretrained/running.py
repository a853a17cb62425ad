"""Running a loaded model: logits and every layer's attention at once, or one layer at a
time for texts too long to keep every layer's T x T maps, with the same head mask as
the paper's model. Parameters on a `data` x `model` mesh run sharded (XLA places the
collectives); one layer's attention at a time is gathered over `model` for the
analyses."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import graphs
from beyondpar.base import checks, parallel
from beyondpar.pretrained.loading import family, layer_name


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
    The same rules as the paper's model (`checks.head_mask`)."""
    if head_mask is None:
        return None
    return checks.head_mask(head_mask, module.config).astype(jnp.float32)


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


def layer_by_layer(module, params, tokens_BxT, head_mask=None) -> Iterator[tuple[int, jax.Array]]:
    """Yield (layer, attention B x H x T x T) one layer at a time, then return the logits
    (as StopIteration.value): only one layer's T x T maps are alive at once, gathered
    over the mesh's `model` axis (`gather_heads`)."""
    tokens = check_tokens(module, tokens_BxT)
    mask = check_head_mask(module, head_mask)
    mesh = parallel.mesh_of(params)
    x = embed(module, params, tokens)
    for i in range(module.config.num_layers):
        x, attn = apply_block(module, params, i, x, None if mask is None else mask[..., i, :])
        yield i, gather_heads(attn, mesh)
    return unembed(module, params, x)


def embed(module, params, tokens_BxT) -> jax.Array:
    """The residual stream entering layer 0 (the family's own embedding: Gemma's scale,
    GPT-2's positions)."""
    return _embed(module, params, tokens_BxT)


def apply_block(module, params, layer: int, x_BxTxD, head_mask=None):
    """(the stream after `layer`, its attention B x H x T x T): one layer from the stream
    entering it, its heads scaled by `head_mask` (H,) or (B, H), for work that shares the
    layers before it; layers of one configuration share one compiled program."""
    block = family(module).block_module(module.config, layer)
    return _block(block, params[layer_name(module, layer)], x_BxTxD, head_mask)


def unembed(module, params, x_BxTxD) -> jax.Array:
    """Logits from the stream after the last layer (final norm, output head, Gemma's
    soft-cap); per token, so any block of tokens gives its own logits."""
    return _unembed(module, params, x_BxTxD)


def gather_heads(attn_BxHxTxT, mesh):
    """A layer's attention with all its heads together on each device that holds part of
    the batch, as the analyses' kernels take it: on one device, or split along the batch
    over every local device (on the first device of `mesh` when the batch does not
    divide). Unchanged without a mesh, on one device, or when the batch is already split
    over every local device by a mesh without a `model` axis."""
    devices = attn_BxHxTxT.sharding.device_set
    local = jax.local_devices()
    if mesh is None or len(devices) == 1:
        return attn_BxHxTxT
    if mesh.shape[parallel.MODEL] == 1 and len(devices) == len(local):
        return attn_BxHxTxT
    if attn_BxHxTxT.shape[0] % len(local) == 0:
        return jax.device_put(attn_BxHxTxT, parallel.batch_sharded(parallel.data_mesh(local)))
    return jax.device_put(attn_BxHxTxT, mesh.devices.flat[0])


def place_tokens(params, tokens_BxT) -> jax.Array:
    """Token ids on the mesh of `params`, split along `data` when the batch divides;
    without a mesh (parameters on one device, uncommitted) split over the local devices
    when that divides, as data parallelism always was."""
    mesh = parallel.mesh_of(params)
    if mesh is None:
        return parallel.split_over_devices(tokens_BxT)
    tokens = np.asarray(tokens_BxT)
    return jax.device_put(tokens, parallel.batch_sharding(mesh, tokens.shape[0]))


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


def head_importances(module, params) -> jax.Array:
    """(L, H): the Frobenius norm of each head's block of each layer's attention output
    projection (the weights the analyses mix heads with)."""
    fam, cfg = family(module), module.config
    kernels = [fam.out_kernel(params, i).astype(jnp.float32) for i in range(cfg.num_layers)]
    return graphs.head_importance(jnp.stack(kernels), cfg.num_heads)
