"""A model run under head masks: the true ablations that head pruning scores, and the
mask gradients behind the `gradient` order.

Model-agnostic: a model is any Flax module whose `apply({"params": p}, tokens,
head_mask=m)` returns logits (B, T, V) with `m` (L, H) or per sequence (B, L, H) scaling
each head's output before its layer's output projection, and whose `config` has
`num_layers`, `num_heads` and `vocab_size` (the paper's model and every pretrained family).
`batch` is a `batches.Batch` (or anything with `inputs`, `targets` and `predictable`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from beyondpar import batches


def masked_logits(module, params, tokens, head_mask):
    """Logits under a head mask, bfloat16 / float16 ones scored in float32 (a float64
    model stays float64)."""
    logits = module.apply({"params": params}, tokens, head_mask=head_mask)
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32))


def sequence_losses(module, params, tokens, targets, head_mask):
    """Mean cross-entropy of each sequence (B,) under a head mask (L, H) or (B, L, H)."""
    logits = masked_logits(module, params, tokens, head_mask)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets), axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def _gradient_importance(module, params, tokens, targets):
    cfg = module.config
    ones = jnp.ones((tokens.shape[0], cfg.num_layers, cfg.num_heads), jnp.float32)
    # One mask per sequence: one backward pass gives every sequence's own gradient.
    total = lambda m: jnp.sum(sequence_losses(module, params, tokens, targets, m))
    return jnp.mean(jnp.abs(jax.grad(total)(ones)), axis=0)


def gradient_importance(module, params, batch) -> jax.Array:
    """(L, H): E_x |dL/d mask_h| at mask = 1 over the sequences of `batch`."""
    return _gradient_importance(
        module, params, jnp.asarray(batch.inputs), jnp.asarray(batch.targets)
    )


@functools.partial(jax.jit, static_argnums=0)
def _masked_scores(module, params, batch: batches.Batch, masks):
    def one(mask):
        logits = masked_logits(module, params, batch.inputs, mask)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch.targets)
        return jnp.mean(loss), batches.accuracy(logits, batch)

    return jax.lax.map(one, masks)


def masked_scores(module, params, batch, masks_PxLxH) -> tuple[np.ndarray, np.ndarray]:
    """(loss (P,), accuracy on predictable positions (P,)) under each head mask, one mask
    at a time in memory: the mean cross-entropy over every position, and the accuracy."""
    loss, accuracy = _masked_scores(
        module,
        params,
        batches.Batch(*(jnp.asarray(a) for a in (batch.inputs, batch.targets, batch.predictable))),
        jnp.asarray(masks_PxLxH, jnp.float32),
    )
    return np.asarray(loss), np.asarray(accuracy)


def attention_necessity(module, params, batch, margin: float = 0.5) -> dict:
    """Does the task need attention? Accuracy on predictable positions with every head,
    with every head masked, and with each layer's heads masked in turn (true ablations
    through the head mask), against chance (1 / vocabulary).

    `needs_attention`: masking every head loses more than `margin` of what the model
    gains over chance (e.g. the copy task's target is the current token, which the
    residual stream carries: it keeps its accuracy with no head at all).
    """
    cfg = module.config
    masks = np.ones((cfg.num_layers + 2, cfg.num_layers, cfg.num_heads), np.float32)
    masks[1] = 0.0
    for layer in range(cfg.num_layers):
        masks[2 + layer, layer] = 0.0
    _, accuracy = masked_scores(module, params, batch, masks)
    chance = 1.0 / cfg.vocab_size
    full, none = float(accuracy[0]), float(accuracy[1])
    return {
        "accuracy": full,
        "accuracy_without_heads": none,
        "accuracy_without_layer": accuracy[2:].tolist(),
        "chance": chance,
        "needs_attention": bool(full - none > margin * max(full - chance, 0.0)),
    }
