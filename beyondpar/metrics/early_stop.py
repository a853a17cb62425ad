"""Loops that stop early: the minimax fidelity of causal operators and the hitting time,
each ended once no later step can change its value, which is then the value every step
gives (a search scores thousands of mixes this way)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from beyondpar.metrics import batching, fused, operators

_HIGHEST = lax.Precision.HIGHEST
# The early stop of the minimax fidelity keeps this relative margin over float32 rounding.
_SETTLE_MARGIN = 1e-3


def minimax(c, horizon: int, causal: bool | None = None) -> jax.Array:
    """Minimax fidelity of row-stochastic operators `c` (...xTxT); causal ones (None:
    checked here) stop their recursion as soon as the minimum is settled
    (`_settled_minimax`)."""
    if not (operators.is_causal(c) if causal is None else causal):
        return jnp.min(fused.sweep(c, horizon=horizon, causal=False).node_fidelity, -1)
    return batching.threaded(functools.partial(_settled_minimax_jit, horizon=horizon), c)


@functools.partial(jax.jit, static_argnames="horizon")
def _settled_minimax_jit(c, *, horizon: int) -> jax.Array:
    return batching.map_blocks(functools.partial(_settled_minimax, horizon=horizon), c)


def _settled_minimax(c, *, horizon: int) -> jax.Array:
    """min_j max_{1<=t<=horizon} s_t[j] of causal operators (b x T x T), early.

    A causal row sends a token's share only to itself and earlier tokens, so the share at
    or after token j never grows (beyond rows summing to a little over 1, `growth` per
    step) and bounds every later s_t[j]. Once the token with the lowest running maximum
    has less than that left at or after it, no later step can change the minimum: the
    loop stops with the value all `horizon` steps give, from the same products.
    """
    b, t = c.shape[0], c.shape[-1]
    tokens = jnp.arange(t)
    growth = jnp.maximum(jnp.max(jnp.sum(c, axis=-1), axis=-1), 1)

    def settled(step, s, best):
        j = jnp.argmin(best, axis=-1)
        tail = jnp.sum(jnp.where(tokens >= j[:, None], s, 0), axis=-1)
        bound = tail * growth ** (horizon - step) * (1 + _SETTLE_MARGIN)
        return jnp.all(bound < jnp.min(best, axis=-1))

    def cond(carry):
        step, s, best = carry
        return (step < horizon) & ~settled(step, s, best)

    def body(carry):
        step, s, best = carry
        s = jnp.einsum("bri,bij->brj", s[:, None], c, precision=_HIGHEST)[:, 0]
        return step + 1, s, jnp.maximum(best, s)

    sink = jnp.broadcast_to(jax.nn.one_hot(t - 1, t, dtype=c.dtype), (b, t))
    _, _, best = lax.while_loop(cond, body, (0, sink, jnp.zeros_like(sink)))
    return jnp.min(best, axis=-1)


def hitting(c, max_steps: int, walk: str, causal: bool | None = None) -> jax.Array:
    """Hitting time of row-stochastic operators `c` (...xTxT) on `walk`: long causal ones
    (None: checked when long) on the triangular path, the rest in a loop that stops once
    every later step would add nothing (`_settled_hitting_time`)."""
    if c.shape[-1] >= fused.TRIANGULAR_MIN_TOKENS and (
        operators.is_causal(c) if causal is None else causal
    ):
        sweep = fused.sweep(c, horizon=0, walks=(walk,), max_steps=max_steps, causal=True)
        return sweep.hitting_time[..., 0]
    return batching.threaded(
        functools.partial(_settled_hitting_jit, max_steps=max_steps, walk=walk), c
    )


@functools.partial(jax.jit, static_argnames=("max_steps", "walk", "settle"))
def _settled_hitting_jit(c, *, max_steps: int, walk: str, settle: bool = True) -> jax.Array:
    run = functools.partial(_settled_hitting_time, max_steps=max_steps, walk=walk, settle=settle)
    return batching.map_blocks(run, c)


def _settled_hitting_time(c, *, max_steps: int, walk: str, settle: bool = True) -> jax.Array:
    """The dense sweep's hitting time of operators `c` (b x T x T), early.

    The sum adds the survival mass of each step, which never grows (beyond rounding,
    `growth` per step): once the mass left is under half a unit in the last place of
    every sum, each later step would round away, and the loop stops with the value that
    all `max_steps` steps of it give (`settle` False: it takes them all, in the same
    arithmetic). The full sweep compiles its products and sums in its own order (the
    normalised walk as a second row of the signal's product): the two agree to float32
    rounding, bit for bit with some dot kernels and not with others.
    """
    b, t = c.shape[0], c.shape[-1]
    off_sink = jnp.broadcast_to(1 - jax.nn.one_hot(t - 1, t, dtype=c.dtype), (b, t))
    if walk == "reference":
        mat, scale = operators.walk_columns(c, "reference"), off_sink[:, None]
    else:
        mat, scale = c, (operators.normalized_scale(c) * off_sink)[:, None]
    growth = jnp.maximum(jnp.max(jnp.sum(mat * scale, axis=-1)), 1)

    def done(step, mass, hit):
        if not settle:
            return step >= max_steps - 1
        left = mass * growth ** (max_steps - 1 - step) * (1 + _SETTLE_MARGIN)
        return (step >= max_steps - 1) | jnp.all(left < (jnp.nextafter(hit, jnp.inf) - hit) / 2)

    def body(carry):
        step, v, hit, _ = carry
        v = jnp.einsum("bri,bij->brj", v, mat, precision=_HIGHEST) * scale
        mass = jnp.sum(v[:, 0], -1)
        return step + 1, v, hit + mass, done(step + 1, mass, hit + mass)

    hit0 = jnp.full((b,), t - 1, c.dtype)  # S_0 summed: T - 1 starts off the sink
    start = (0, off_sink[:, None], hit0, done(0, hit0, hit0))
    return lax.while_loop(lambda carry: ~carry[3], body, start)[2] / t
