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
from jax import lax

from beyondpar import graphs, metrics
from beyondpar.base import checks
from beyondpar.weighting import OBJECTIVES, optimal_weights  # noqa: F401 - public API


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


def check_heads(attn, validate: bool = True) -> jax.Array:
    """Attention `...xHxTxT` as a float array, rows checked like any operator (the shape
    only, when `validate` is False)."""
    a = checks.as_float_array("attn", attn)
    if a.ndim < 3:
        raise ValueError(f"attn must have shape (..., H, T, T), got shape {a.shape}")
    return metrics.check_operator(a, "attn") if validate else a


def pairwise_synergy(attn_xHxTxT, horizon: int = 100):
    """(..., H, H): minimax fidelity of each 50/50 pair of heads minus the better head.

    Positive entries are pairs that together keep more of every token than either alone
    (the paper's Example 2 pair gains 5/12 - 3/8 = 1/24); the diagonal is 0. The H heads
    and the H (H - 1) / 2 distinct pairs go through the metric kernels as one batch.
    """
    attn = check_heads(attn_xHxTxT)
    h = attn.shape[-3]
    rows, cols = jnp.triu_indices(h, 1)
    pairs = 0.5 * (attn[..., rows, :, :] + attn[..., cols, :, :])
    fid = metrics.minimax_fidelity(jnp.concatenate([attn, pairs], axis=-3), horizon)
    alone, mixed = fid[..., :h], fid[..., h:]
    gain = mixed - jnp.maximum(alone[..., rows], alone[..., cols])
    out = jnp.zeros((*fid.shape[:-1], h, h), fid.dtype)
    return out.at[..., rows, cols].set(gain).at[..., cols, rows].set(gain)


def head_diversity(attn_xHxTxT, validate: bool = True) -> jax.Array:
    """Mean over head pairs and query rows of the total-variation distance between the two
    heads' attention rows: 0 for identical heads, 1 for disjoint supports (0 for H = 1).
    `validate` False skips the check of attention already checked."""
    attn = check_heads(attn_xHxTxT, validate)
    return _diversity(attn)


@jax.jit
def _diversity(attn):
    h = attn.shape[-3]
    if h == 1:
        return jnp.zeros(attn.shape[:-3], attn.dtype)
    rows, cols = jnp.triu_indices(h, 1)

    def pair(ij):  # one pair at a time: all pairs at once would be H^2 / 2 copies of attn
        a, b = jnp.take(attn, ij[0], axis=-3), jnp.take(attn, ij[1], axis=-3)
        return jnp.mean(0.5 * jnp.sum(jnp.abs(a - b), axis=-1), axis=-1)

    return jnp.mean(lax.map(pair, (rows, cols)), axis=0)


def cross_head_share(
    attn_xHxTxT, weights_xH, horizon: int = 100, validate: bool = True
) -> jax.Array:
    """(..., T): share of each token's sink signal, at the step that attains its fidelity,
    carried by paths that use edges of more than one head.

    With C = sum_h w_h A_h, s_t = e_tau^T C^t and the single-head part
    p_t = sum_h w_h^t e_tau^T A_h^t: share[j] = 1 - p_{t_j}[j] / s_{t_j}[j] at
    t_j = the first step attaining max_t s_t[j] (0 where s is 0). One pass of H + 1
    vector recursions, never a T x T power. `validate` False: as in `head_diversity`.
    """
    attn = check_heads(attn_xHxTxT, validate)
    w = graphs.normalize_weights(weights_xH, attn.shape[-3]).astype(attn.dtype)
    horizon = checks.positive_int("horizon", horizon)
    return _cross_head_share(attn, w, horizon)


@functools.partial(jax.jit, static_argnames="horizon")
def _cross_head_share(attn, w, horizon: int):
    t = attn.shape[-1]
    mixed = jnp.einsum("...h,...hij->...ij", w, attn)
    sink = jax.nn.one_hot(t - 1, t, dtype=attn.dtype)
    s0 = jnp.broadcast_to(sink, mixed.shape[:-1])
    p0 = jnp.broadcast_to(sink, attn.shape[:-1])  # one row per head
    hp = lax.Precision.HIGHEST

    def step(_, carry):
        s, p, best_s, best_p = carry
        s = jnp.einsum("...i,...ij->...j", s, mixed, precision=hp)
        p = jnp.einsum("...hi,...hij->...hj", p, attn, precision=hp) * w[..., None]
        single = jnp.sum(p, axis=-2)
        better = s > best_s
        return s, p, jnp.where(better, s, best_s), jnp.where(better, single, best_p)

    zeros = jnp.zeros_like(s0)
    _, _, best_s, best_p = lax.fori_loop(0, horizon, step, (s0, p0, zeros, zeros))
    safe = jnp.where(best_s > 0, best_s, 1)
    return jnp.where(best_s > 0, 1 - best_p / safe, 0)
