"""A model run from one layer's input: the stream entering a layer computed once, then
only that layer (under a head mask) and the layers after it, and each sequence's
cross-entropy a block of tokens at a time, so that the (tokens x vocabulary) logits are
never alive at once.

For work that changes one layer's heads many times (the loss game's 2^H masks): the
layers before it are shared by every mask, and the output head, the largest matrix of a
language model, holds one block of logits instead of every token's. Both kinds of model
run through their own layer code: the paper's (`model.embed / apply_layer / unembed`)
and the pretrained families' (`pretrained.running.embed / apply_block / unembed`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from beyondpar import model as model_lib
from beyondpar.pretrained import running

LOGITS_PER_BLOCK = 2**24  # floats of one block of logits: 64 MB in float32


def is_paper_model(module) -> bool:
    return isinstance(module, model_lib.Transformer)


@functools.partial(jax.jit, static_argnums=0)
def _paper_embed(module, params, tokens):
    return model_lib.embed(module, params, tokens)


@functools.partial(jax.jit, static_argnums=0)
def _paper_layer(module, layer_params, x, head_mask):
    # One program for every layer of the paper's model; its attention is left unused.
    return model_lib.apply_layer(module, layer_params, x, head_mask)[0]


def check_layer(module, layer: int) -> int:
    count = module.config.num_layers
    if not (isinstance(layer, (int, np.integer)) and 0 <= layer < count):
        raise ValueError(f"layer must be an integer in [0, {count}), got {layer!r}")
    return int(layer)


def stream_into(module, params, tokens_BxT, layer: int) -> jax.Array:
    """(B, T, D): the residual stream entering `layer`, every earlier head kept."""
    layer = check_layer(module, layer)
    if is_paper_model(module):
        x = _paper_embed(module, params, jnp.asarray(tokens_BxT))
    else:
        x = running.embed(module, params, jnp.asarray(tokens_BxT))
    for i in range(layer):
        x = run_layer(module, params, i, x)
    return x


def run_layer(module, params, layer: int, x_BxTxD, head_mask=None) -> jax.Array:
    """The stream after `layer` from the stream entering it, heads scaled by `head_mask`
    (H,) or (B, H) (None: every head as it is)."""
    if is_paper_model(module):
        return _paper_layer(module, params[f"layers_{layer}"], x_BxTxD, head_mask)
    return running.apply_block(module, params, layer, x_BxTxD, head_mask)[0]


def run_from(module, params, x_BxTxD, layer: int, head_mask_BxH=None) -> jax.Array:
    """The stream after the last layer from the stream entering `layer`: that layer under
    `head_mask_BxH`, every later one with all its heads."""
    layer = check_layer(module, layer)
    x = run_layer(module, params, layer, x_BxTxD, head_mask_BxH)
    for i in range(layer + 1, module.config.num_layers):
        x = run_layer(module, params, i, x)
    return x


def block_tokens(tokens: int, vocab_size: int, logits_per_block: int = LOGITS_PER_BLOCK) -> int:
    """Tokens per block of logits: at most `logits_per_block` logits, the blocks as even
    as that allows (the last one padded by less than one token per block)."""
    most = max(1, min(tokens, logits_per_block // vocab_size))
    blocks = -(-tokens // most)
    return -(-tokens // blocks)


def _unembed(module, params, x):
    if is_paper_model(module):
        return model_lib.unembed(module, params, x)
    return running.unembed(module, params, x)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _blocked_losses(module, params, x_BxTxD, targets_BxT, block: int):
    b, t, d = x_BxTxD.shape
    pad = -(b * t) % block
    x = jnp.pad(x_BxTxD.reshape(b * t, d), ((0, pad), (0, 0))).reshape(-1, 1, block, d)
    targets = jnp.pad(targets_BxT.reshape(b * t), (0, pad)).reshape(-1, 1, block)

    def one(pair):
        logits = _unembed(module, params, pair[0])
        logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
        return optax.softmax_cross_entropy_with_integer_labels(logits, pair[1])[0]

    losses = jax.lax.map(one, (x, targets)).reshape(-1)[: b * t]
    return jnp.mean(losses.reshape(b, t), axis=-1)


def sequence_losses(module, params, x_BxTxD, targets_BxT, logits_per_block=None):
    """(B,): each sequence's mean cross-entropy from the stream after the last layer, its
    logits (bfloat16 / float16 scored in float32) formed a block of at most
    `logits_per_block` (default `LOGITS_PER_BLOCK`) logits at a time."""
    b, t = np.shape(targets_BxT)
    most = LOGITS_PER_BLOCK if logits_per_block is None else logits_per_block
    block = block_tokens(b * t, module.config.vocab_size, most)
    return _blocked_losses(module, params, x_BxTxD, jnp.asarray(targets_BxT), block)
