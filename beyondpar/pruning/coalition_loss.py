"""The loss as the value of a coalition of one layer's heads: how much of the loss of
masking every head of the layer the coalition S restores,

    v(S) = L(every head of the layer masked) - L(only the heads in S kept),

so v(empty) = 0 and v(all) = L(all masked) - L(unmasked); the other layers keep every
head. Each sequence has its own game (losses are per sequence). Heads are removed by the
true head mask (`head_masking`), on the paper's model and every pretrained family alike.

Few heads: every coalition (2^H masks), the masked sequences batched `max_tokens` tokens
at a time; more than `exact_heads`: Shapley values from sampled permutations
(`coalitions.sampled_shapley`), with standard errors. The layers before the masked one
run once (`layer_slice`), so the cost per layer, in sequences through layers `layer`..L-1
and the output head, is 2^H x B exact, at most (permutations (H - 1) + 2) x B sampled.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from beyondpar import coalitions
from beyondpar.base import checks
from beyondpar.measure import coalition_game
from beyondpar.pruning import layer_slice


def coalition_masks(num_heads: int) -> np.ndarray:
    """(2^H, H) 0/1: row c keeps head h when bit h of c is set."""
    index = np.arange(2**num_heads)[:, None]
    return ((index >> np.arange(num_heads)) & 1).astype(np.float32)


def layer_masks(masks_KxH, layer: int, num_layers: int) -> np.ndarray:
    """(K, L, H) head masks: every layer's heads kept, `layer`'s as each coalition says."""
    masks = np.asarray(masks_KxH, np.float32)
    out = np.ones((masks.shape[0], num_layers, masks.shape[1]), np.float32)
    out[:, layer] = masks
    return out


def masked_losses(module, params, batch, layer: int, masks_KxH, max_tokens: int = 8192, bar=None):
    """(B, K): each sequence's loss with `layer`'s heads masked as each row of `masks_KxH`
    says (every other layer's heads kept). The stream entering `layer` is computed once;
    each pass runs that layer and the later ones for as many masks as keep it within
    `max_tokens` tokens (at least one mask; the last pass padded, so that every pass has
    one shape), the logits a block of tokens at a time (`layer_slice`); `bar` counts the
    masks."""
    masks = np.asarray(masks_KxH, np.float32)
    if masks.ndim != 2 or masks.shape[1] != module.config.num_heads:
        raise ValueError(
            f"masks_KxH must have shape (K, {module.config.num_heads}), got {masks.shape}"
        )
    stream = layer_slice.stream_into(module, params, batch.inputs, layer)
    b = stream.shape[0]
    per_pass = min(max(1, max_tokens // int(np.size(batch.inputs))), len(masks))
    streams = jnp.concatenate([stream] * per_pass)  # mask-major: row k * B + i
    targets = np.tile(np.asarray(batch.targets), (per_pass, 1))
    parts = []
    for start in range(0, len(masks), per_pass):
        part = masks[start : start + per_pass]
        padded = np.concatenate([part, np.ones((per_pass - len(part), part.shape[1]), np.float32)])
        out = layer_slice.run_from(module, params, streams, layer, np.repeat(padded, b, axis=0))
        losses = layer_slice.sequence_losses(module, params, out, targets)
        parts.append(np.asarray(losses).reshape(per_pass, b).T[:, : len(part)])
        if bar is not None:
            bar.update(len(part))
    return np.concatenate(parts, axis=1)


def loss_values(module, params, batch, layer: int, max_tokens: int = 8192, bar=None):
    """(B, 2^H): every coalition's value v(S) = L(layer masked) - L(S kept), per sequence
    (coalition c keeps the heads of the set bits of c)."""
    losses = masked_losses(
        module, params, batch, layer, coalition_masks(module.config.num_heads), max_tokens, bar
    )
    return losses[:, :1] - losses


def loss_value_fn(module, params, batch, layer: int, max_tokens: int = 8192, bar=None):
    """value_fn for `coalitions.sampled_shapley`: (K, H) 0/1 masks -> (B, K) values, the
    loss with every head of the layer masked computed once."""
    empty = np.zeros((1, module.config.num_heads), np.float32)
    base = masked_losses(module, params, batch, layer, empty, max_tokens)

    def value_fn(masks_KxH):
        masks = np.asarray(masks_KxH, np.float32)
        return base - masked_losses(module, params, batch, layer, masks, max_tokens, bar)

    return value_fn


@dataclasses.dataclass(frozen=True)
class LossGameSpec:
    """How the loss game is valued: every coalition up to `exact_heads` heads, else
    `permutations` sampled orders (seeded by `seed` plus the layer); at most `max_tokens`
    masked tokens per forward pass."""

    exact_heads: int = 10
    permutations: int = 32
    seed: int = 0
    max_tokens: int = 8192

    def __post_init__(self):
        for name in ("exact_heads", "permutations", "max_tokens"):
            checks.positive_int(name, getattr(self, name))


def layer_fields(module, params, batch, layer: int, spec: LossGameSpec, progress: bool = False):
    """One layer's loss game as the record's COALITION fields ending in `_loss`: exact
    (Shapley, interaction, pair and triple dividends) up to `spec.exact_heads` heads, else
    sampled Shapley values with standard errors. A bar states the layer's cost."""
    h, b = module.config.num_heads, int(np.shape(batch.inputs)[0])
    exact = h <= spec.exact_heads
    count = 2**h if exact else spec.permutations * (h - 1) + 2  # at most, sampled
    what = "coalitions" if exact else f"masks at most ({spec.permutations} permutations)"
    desc = f"layer {layer}: {count} {what} x {b} windows"
    with tqdm.tqdm(total=count, desc=desc, unit="mask", disable=not progress) as bar:
        if exact:
            values = loss_values(module, params, batch, layer, spec.max_tokens, bar)
            return coalition_game.game_fields(values, "loss")
        value_fn = loss_value_fn(module, params, batch, layer, spec.max_tokens, bar)
        key = jax.random.PRNGKey(spec.seed + layer)
        mean, stderr = coalitions.sampled_shapley(value_fn, h, spec.permutations, key)
    return coalition_game.sampled_fields(mean, stderr, "loss")
