"""Operators in: the check every public kernel runs on its input, and the walk laws.

`check_operator` reads a batch of row-stochastic T x T operators once (in threads on a
single CPU device); `walk_columns` builds the forward walk of either flavour in column
form, the form the recursions step; `is_causal` picks the triangular path.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondpar.base import checks, parallel
from beyondpar.metrics import batching

WALKS = ("reference", "normalized")
ROW_SUM_TOLERANCE = 1e-4
_HIGHEST = lax.Precision.HIGHEST


@jax.jit
def _operator_stats(c):
    """(rows finite, smallest entry, largest row-sum error) from reductions along the rows:
    XLA runs them as a few passes over the batch, where whole-batch reductions of different
    shapes took three times as long. A NaN or infinite entry makes its row's sum NaN or
    infinite; so does a row of finite entries whose sum overflows, which `check_operator`
    tells apart."""
    sums = jnp.sum(c, axis=-1)
    return jnp.all(jnp.isfinite(sums)), jnp.min(jnp.min(c, axis=-1)), jnp.max(jnp.abs(sums - 1))


@jax.jit
def _all_finite(c):
    return jnp.all(jnp.isfinite(c))


def spread(c):
    """Arrays committed to one device are split over all local devices (along the first
    axis when it divides, else copied to each), so that the kernels can take them.

    Producers that already split their batch over devices (see `evaluate`) pay nothing.
    """
    mesh = parallel.local_mesh()
    on_one_device = (
        checks.is_concrete(c) and getattr(c, "committed", False) and len(c.sharding.device_set) == 1
    )
    if mesh is not None and on_one_device:
        split = c.ndim > 2 and c.shape[0] % mesh.size == 0
        c = jax.device_put(c, parallel.batch_sharded(mesh) if split else parallel.replicated(mesh))
    return c


def check_operator(c, name: str = "c") -> jax.Array:
    """`c` as a float array after checking it is a batch of row-stochastic T x T operators.

    Half-precision input (float16, bfloat16: attention saved from a model run in half
    precision) is widened to float32, the narrowest dtype the recursions run in, and its
    rows need sum to 1 only to within its own rounding (its machine epsilon, where that
    exceeds `ROW_SUM_TOLERANCE`)."""
    c = checks.square_matrices(name, c)
    tolerance = max(ROW_SUM_TOLERANCE, float(jnp.finfo(c.dtype).eps))
    if jnp.finfo(c.dtype).bits < 32:
        c = c.astype(jnp.float32)
    if c.shape[-1] < 2:
        raise ValueError(f"{name} must have at least T=2 tokens, got T={c.shape[-1]}")
    if c.size and checks.is_concrete(c):
        stats = np.asarray(batching.in_threads(_operator_stats, c), np.float64)  # parts x 3
        finite, minimum, row_error = stats[:, 0].all(), stats[:, 1].min(), stats[:, 2].max()
        if not finite and not _all_finite(c):  # else finite entries whose rows overflow
            raise ValueError(f"{name} must be finite, got NaN or Inf entries")
        if minimum < 0:
            raise ValueError(f"{name} must be non-negative, got minimum entry {minimum:.3g}")
        if row_error > tolerance:
            raise ValueError(
                f"{name} rows must sum to 1 (tolerance {tolerance:.3g}), "
                f"got a row off by {row_error:.3g}"
            )
    return spread(c)


def check_walk(walk: str) -> str:
    return checks.one_of("walk", walk, WALKS)


def walk_columns(c, walk: str):
    """Walk law in column form: W[..., j, i] = P[i, j], the step from token i to j.

    Row vectors times W advance the survival vector, like row vectors times c advance the
    sink signal. Column i of W is built from column i of c.
    """
    tau = c.shape[-1] - 1
    sink = jax.nn.one_hot(tau, c.shape[-1], dtype=c.dtype)
    if walk == "reference":
        # The paper's sampler walks the unnormalised column: clipped cumulative mass,
        # with the shortfall sent to the sink.
        w, clipped_mass = _clipped_steps(c)
        w = w.at[..., tau, :].add(1.0 - clipped_mass)
    else:
        mass = jnp.sum(c, axis=-2, keepdims=True)
        # A token nobody reads has no way on: it jumps straight to the sink.
        w = jnp.where(mass > 0, c / jnp.where(mass > 0, mass, 1), sink[:, None])
    # The sink is absorbing.
    return w.at[..., :, tau].set(sink)


def normalized_scale(c):
    """1 / column mass: row vectors times c, rescaled, step the normalised walk."""
    mass = jnp.sum(c, axis=-2)
    return jnp.where(mass > 0, 1 / jnp.where(mass > 0, mass, 1), 0)


def _clipped_steps(c):
    """(min(1, cum_j) - min(1, cum_{j-1}) down each column, min(1, column mass)), with
    cum_j the cumulative sum of rows 0..j.

    XLA's cumsum does O(T) work per element on CPU, and a loop over T rows is all loop
    overhead for T x T matrices. There the rows are cut into about sqrt(T) blocks: block
    offsets from the block sums, then one loop over the rows of every block at once.
    Accelerators get one GEMM with a triangle of ones.
    """
    t = c.shape[-2]
    if jax.default_backend() != "cpu":
        ones = jnp.tril(jnp.ones((t, t), c.dtype))
        cum = jnp.minimum(1.0, jnp.einsum("jr,...ri->...ji", ones, c, precision=_HIGHEST))
        return jnp.diff(cum, axis=-2, prepend=jnp.zeros_like(cum[..., :1, :])), cum[..., -1, :]
    size = _rows_per_block(t)
    count = -(-t // size)
    x = c
    if count * size > t:
        x = jnp.pad(c, [(0, 0)] * (c.ndim - 2) + [(0, count * size - t), (0, 0)])
    x = x.reshape(*c.shape[:-2], count, size, c.shape[-1])
    totals = jnp.sum(x, axis=-2)
    offsets = jnp.cumsum(totals, axis=-2) - totals  # mass of every block before

    def add_row(i, state):
        before, out = state
        after = before + lax.dynamic_index_in_dim(x, i, axis=-2, keepdims=False)
        step = jnp.minimum(1.0, after) - jnp.minimum(1.0, before)
        return after, lax.dynamic_update_index_in_dim(out, step, i, axis=-2)

    last, steps = lax.fori_loop(0, size, add_row, (offsets, jnp.zeros_like(x)))
    steps = steps.reshape(*c.shape[:-2], count * size, c.shape[-1])[..., :t, :]
    return steps, jnp.minimum(1.0, last[..., -1, :])


def _rows_per_block(t: int) -> int:
    """About sqrt(t) rows, a divisor of t when one is near (no padding copy)."""
    root = math.isqrt(t - 1) + 1
    near = [d for d in range(max(1, root // 2), 2 * root + 1) if t % d == 0]
    return min(near, key=lambda d: abs(d - root)) if near else root


def transition_matrix(c, walk: str = "reference") -> jax.Array:
    """Forward walk P (rows: from key i, columns: to query j) of operators `...xTxT`."""
    walk = check_walk(walk)
    c = check_operator(c)
    if checks.is_concrete(c):
        return _transition_matrix(c, walk=walk)
    return jnp.swapaxes(walk_columns(c, walk), -1, -2)  # traced: part of the caller's jit


@functools.partial(jax.jit, static_argnames="walk")
def _transition_matrix(c, *, walk: str) -> jax.Array:
    """One program per shape and walk: run op by op, the walk's pads, loop and updates
    would each compile and dispatch a program of their own (about twenty)."""
    return jnp.swapaxes(walk_columns(c, walk), -1, -2)


@jax.jit
def _lower_triangular(c):
    return jnp.all(jnp.triu(c, 1) == 0)


def is_causal(c) -> bool:
    """Whether every matrix of `c` (...xTxT, concrete) is lower triangular: a token reads
    only itself and earlier tokens. One pass over the entries; False for traced arrays."""
    return checks.is_concrete(c) and c.size > 0 and bool(_lower_triangular(c))
