"""Multi-head analyses on top of the metric kernels: does mixing beat every head, and why?

- `amplification`: the mixed operator against its best head (the paper's Tables 5-6);
- `pairwise_synergy`: every 50/50 pair of heads against its better head;
- `head_diversity`: how differently the heads attend (total-variation distance of rows);
- `cross_head_share`: how much of each token's signal at the sink travels on paths that
  switch heads, which no single head has;
- `optimal_weights` (in `weighting`): the head mix that maximises fidelity or minimises
  hitting time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics
from beyondpar.base import checks
from beyondpar.weighting import OBJECTIVES, optimal_weights  # noqa: F401 - public API

DIVERSITY_ROW_BLOCKS = 4  # causal attention: rows in blocks, each without the keys after it


def amplification(per_head_fidelity_xH, combined_fidelity):
    """The paper's Tables 5-6: best individual head, combined, and the gain.

    `per_head_fidelity_xH` (..., H) holds each head's own minimax fidelity and
    `combined_fidelity` (...) that of the mixed operator; gain = combined - best.
    """
    per_head = checks.as_float_array("per_head_fidelity_xH", per_head_fidelity_xH)
    combined = checks.as_float_array("combined_fidelity", combined_fidelity)
    if per_head.ndim < 1 or per_head.shape[-1] < 1:
        raise ValueError(
            "per_head_fidelity_xH must end in an axis of at least one head, "
            f"got shape {per_head.shape}"
        )
    if combined.shape != per_head.shape[:-1]:
        raise ValueError(
            f"combined_fidelity must have shape {per_head.shape[:-1]} (one value per "
            f"row of per_head_fidelity_xH), got shape {combined.shape}"
        )
    best = jnp.max(per_head, axis=-1)
    return {"best_individual": best, "combined": combined, "gain": combined - best}


def check_heads(attn, validate: bool = True) -> jax.Array:
    """Attention `...xHxTxT` as a float array, rows checked like any operator (the shape
    only, when `validate` is False)."""
    a = checks.as_float_array("attn", attn)
    if a.ndim < 3:
        raise ValueError(f"attn must have shape (..., H, T, T), got shape {a.shape}")
    return metrics.check_operator(a, "attn") if validate else a


def pairwise_synergy(attn, horizon: int = 100):
    """(..., H, H) from attention `attn` (..., H, T, T): minimax fidelity of each 50/50 pair
    of heads minus the better head.

    Positive entries are pairs that together keep more of every token than either alone
    (the paper's Example 2 pair gains 5/12 - 3/8 = 1/24); the diagonal is 0. The H heads
    and the H (H - 1) / 2 distinct pairs go through the metric kernels as one batch.
    """
    attn = check_heads(attn)
    horizon = checks.positive_int("horizon", horizon)
    # The pairs mix checked heads: row-stochastic without a second check, and causal
    # when the heads are (one pass over H operators, not over all H + H (H - 1) / 2).
    fidelity = metrics.objective_unchecked(
        _heads_and_pairs(attn), "fidelity", horizon, 1, "reference", metrics.is_causal(attn)
    )
    return _pair_gains(fidelity, attn.shape[-3])


# Built and read in one jitted call each: op by op, every gather and sum of a batch of
# pairs (120 of them at 16 heads) is a pass of its own over memory.
@jax.jit
def _heads_and_pairs(attn):
    """(..., H + H (H - 1) / 2, T, T): the heads, then each distinct pair's 50/50 mix."""
    rows, cols = np.triu_indices(attn.shape[-3], 1)
    pairs = 0.5 * (attn[..., rows, :, :] + attn[..., cols, :, :])
    return jnp.concatenate([attn, pairs], axis=-3)


@functools.partial(jax.jit, static_argnums=1)
def _pair_gains(fidelity, h: int):
    """(..., H, H) symmetric: each pair's fidelity minus its better head's, 0 on the diagonal."""
    rows, cols = np.triu_indices(h, 1)
    alone, mixed = fidelity[..., :h], fidelity[..., h:]
    gain = mixed - jnp.maximum(alone[..., rows], alone[..., cols])
    out = jnp.zeros((*fidelity.shape[:-1], h, h), fidelity.dtype)
    return out.at[..., rows, cols].set(gain).at[..., cols, rows].set(gain)


def head_diversity(attn, validate: bool = True, causal: bool | None = None) -> jax.Array:
    """(...) from attention `attn` (..., H, T, T): mean over head pairs and query rows of the
    total-variation distance between the two heads' attention rows: 0 for identical heads,
    1 for disjoint supports (0 for H = 1).
    `validate` False skips the check of attention already checked; `causal` says whether
    it is lower triangular when the caller knows (None: checked, one pass)."""
    attn = check_heads(attn, validate)
    long = attn.shape[-1] >= 8
    # Causal rows read only earlier keys: each block of rows skips the keys after it.
    blocks = (
        DIVERSITY_ROW_BLOCKS
        if long and (metrics.is_causal(attn) if causal is None else causal)
        else 1
    )
    return _diversity(attn, blocks)


@functools.partial(jax.jit, static_argnums=1)
def _diversity(attn, row_blocks: int):
    h, t = attn.shape[-3], attn.shape[-1]
    if h == 1:
        return jnp.zeros(attn.shape[:-3], attn.dtype)
    rows = jnp.swapaxes(attn, -3, -2)  # ... x T x H x T: a query's rows of every head together
    total = 0.0
    for q in range(row_blocks):
        lo, hi = q * t // row_blocks, (q + 1) * t // row_blocks
        block = rows[..., lo:hi, :, :hi]
        l1 = jnp.sum(jnp.abs(block[..., :, None, :] - block[..., None, :, :]), axis=-1)
        total = total + jnp.sum(jnp.triu(jnp.sum(l1, axis=-3), 1), axis=(-2, -1))
    return 0.5 * total / (t * h * (h - 1) / 2)


def cross_head_share(attn, weights, horizon: int = 100, validate: bool = True) -> jax.Array:
    """(..., T) from attention `attn` (..., H, T, T) mixed with `weights` (..., H): the share
    of each token's sink signal, at the step that attains its fidelity, carried by paths
    that use edges of more than one head.

    With C = sum_h w_h A_h, s_t = e_tau^T C^t and the single-head part
    p_t = sum_h w_h^t e_tau^T A_h^t: share[j] = 1 - p_{t_j}[j] / s_{t_j}[j] at
    t_j = the first step attaining max_t s_t[j] (0 where s is 0). The sink signals of the
    mix and of every head come from one kernel call, never a T x T power. `validate`
    False: as in `head_diversity`.
    """
    attn = check_heads(attn, validate)
    w = graphs.normalize_weights(weights, attn.shape[-3]).astype(attn.dtype)
    horizon = checks.positive_int("horizon", horizon)
    mixed = jnp.einsum("...h,...hij->...ij", w, attn)
    ops = jnp.concatenate([mixed[..., None, :, :], attn], axis=-3)
    signals = metrics.sink_signal(ops, horizon, validate=False)
    return cross_head_share_of_signals(signals[..., 0, :, :], signals[..., 1:, :, :], w)


def cross_head_share_of_signals(mixed_xKxT, heads_xHxKxT, weights_xH) -> jax.Array:
    """`cross_head_share` from sink signals already computed (`metrics.sink_signal` or
    `metrics.metrics_by_walk(..., signal=True)`): the mix's (..., K, T), every head's
    (..., H, K, T) and the normalised weights (..., H) of the mix."""
    return _share_of_signals(jnp.asarray(mixed_xKxT), jnp.asarray(heads_xHxKxT), weights_xH)


@jax.jit
def _share_of_signals(mixed, heads, w):
    peak = jnp.argmax(mixed, axis=-2)  # the first step attaining the maximum
    best_s = jnp.take_along_axis(mixed, peak[..., None, :], axis=-2)[..., 0, :]
    at_peak = jnp.take_along_axis(heads, peak[..., None, None, :], axis=-2)[..., 0, :]
    steps = (peak + 1).astype(mixed.dtype)  # row k of the signal is step k + 1
    powers = jnp.asarray(w, mixed.dtype)[..., :, None] ** steps[..., None, :]
    best_p = jnp.sum(powers * at_peak, axis=-2)
    safe = jnp.where(best_s > 0, best_s, 1)
    return jnp.where(best_s > 0, 1 - best_p / safe, 0)
