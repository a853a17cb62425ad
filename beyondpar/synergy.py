"""Multi-head analyses on top of the metric kernels: does mixing beat every head?"""

from __future__ import annotations

import jax.numpy as jnp

from beyondpar import metrics


def amplification(per_head_fidelity_xH, combined_fidelity):
    """The paper's Tables 5-6: best individual head, combined, and the gain.

    `per_head_fidelity_xH` (..., H) holds each head's own minimax fidelity and
    `combined_fidelity` (...) that of the mixed operator; gain = combined - best.
    """
    best = jnp.max(per_head_fidelity_xH, axis=-1)
    return {
        "best_individual": best,
        "combined": combined_fidelity,
        "gain": combined_fidelity - best,
    }


def pairwise_synergy(attn_xHxTxT, horizon: int = 100):
    """(..., H, H): minimax fidelity of each 50/50 pair of heads minus the better head.

    Positive entries are pairs that together keep more of every token than either alone
    (the paper's Example 2 pair gains 5/12 - 3/8 = 1/24); the diagonal is 0. All pairs go
    through the metric kernels as one batch.
    """
    attn = jnp.asarray(attn_xHxTxT)
    if attn.ndim < 3:
        raise ValueError(f"attn must have shape (..., H, T, T), got shape {attn.shape}")
    pairs = 0.5 * (attn[..., :, None, :, :] + attn[..., None, :, :, :])  # ... x H x H x T x T
    mixed = metrics.minimax_fidelity(pairs, horizon)
    alone = jnp.diagonal(mixed, axis1=-2, axis2=-1)  # a head mixed with itself is itself
    return mixed - jnp.maximum(alone[..., :, None], alone[..., None, :])
