"""Spectral estimates: the radius of the walk without the sink, and the mixing time it
implies. Causal operators give triangular walks, whose radius is a diagonal entry."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from beyondpar.metrics import operators

POWER_ITERATIONS = 1000


def _spectral_radius_cols(walk_cols):
    """Spectral radius of Q (the walk without the sink) from the walk in column form."""
    q_t = walk_cols[..., :-1, :-1]  # Q transposed: same spectrum
    diag = jnp.max(jnp.diagonal(q_t, axis1=-2, axis2=-1), axis=-1)
    lower = jnp.all(jnp.triu(q_t, 1) == 0, axis=(-2, -1))
    upper = jnp.all(jnp.tril(q_t, -1) == 0, axis=(-2, -1))
    triangular = lower | upper

    def perron_root(_):
        # Power iteration on Q + I: the shift keeps the Perron root dominant and strictly
        # separated even for periodic Q; for v >= 0 the 1-norm ratio converges to it.
        def step(_, v):
            v = v + jnp.einsum("bi,bij->bj", v, q_t, precision=lax.Precision.HIGHEST)
            return v / jnp.sum(v, -1, keepdims=True)

        v0 = jnp.full(q_t.shape[:-1], 1.0 / q_t.shape[-1], q_t.dtype)
        v = lax.fori_loop(0, POWER_ITERATIONS, step, v0)
        qv = jnp.einsum("bi,bij->bj", v, q_t, precision=lax.Precision.HIGHEST)
        return jnp.where(triangular, diag, jnp.sum(qv, -1) / jnp.sum(v, -1))

    # Causal attention gives triangular Q, whose radius is its largest diagonal entry.
    return lax.cond(jnp.all(triangular), lambda _: diag, perron_root, None)


def mixing_from_radius(rho, eps: float, max_steps: int):
    safe = jnp.clip(rho, 1e-30, 1 - 1e-12)
    estimate = jnp.log(1 / eps) / jnp.log(1 / safe)
    estimate = jnp.where(rho >= 1, max_steps, jnp.minimum(estimate, max_steps))
    return jnp.where(rho <= 0, 0.0, estimate).astype(rho.dtype)


def spectral_radius_of(c, walk, columns, causal: bool):
    """Spectral radius of the walk without the sink; for causal operators the largest
    diagonal entry of the triangular walk, without building (or checking) the walk."""
    if not causal:
        return _spectral_radius_cols(
            columns[walk] if walk in columns else operators.walk_columns(c, walk)
        )
    diag = jnp.diagonal(c, axis1=-2, axis2=-1)[:, :-1]
    if walk == "normalized":
        mass = jnp.sum(c, axis=-2)[:, :-1]
        diag = jnp.where(mass > 0, diag / jnp.where(mass > 0, mass, 1), 0)
    else:  # reference: the clipped cumulative mass of column i starts at min(1, c[i, i])
        diag = jnp.minimum(diag, 1)
    return jnp.max(diag, axis=-1)
