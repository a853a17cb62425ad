"""The public kernels: validate their arguments outside jit, then run the sweep or an
early-stopping loop. Every kernel takes row-stochastic operators `c` of shape `...xTxT`
(rows: queries that read, columns: keys that are read; the sink is the last token
tau = T - 1) and returns one value per operator (or per token)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from beyondpar.base import checks
from beyondpar.metrics import early_stop, fused, operators, spectral


class OperatorMetrics(NamedTuple):
    """Everything the evaluation needs from one operator, computed in one pass."""

    node_fidelity: jax.Array  # ...xT
    minimax_fidelity: jax.Array  # ...
    hitting_time: jax.Array  # ...
    tv_mixing_time: jax.Array  # ... (int32)
    spectral_radius: jax.Array  # ...
    spectral_mixing_time: jax.Array  # ...


def sink_signal(c, steps: int, validate: bool = True) -> jax.Array:
    """s_t = e_tau^T c^t for t = 1..steps, shape ...x steps x T: token j's share at the sink.
    `validate` False: as in `operator_metrics`."""
    c = operators.check_operator(c) if validate else operators.spread(jnp.asarray(c))
    steps = checks.positive_int("steps", steps)
    return fused.sweep(c, horizon=steps, signal=True).sink_signal


def row_powers(v0, mat, steps: int, keep=1):
    """v_t = (v_{t-1} mat) * keep for t = 1..steps, stacked on axis -2."""

    def step(v, _):
        v = jnp.einsum("...i,...ij->...j", v, mat, precision=lax.Precision.HIGHEST) * keep
        return v, v

    _, out = lax.scan(step, v0, None, length=steps)
    return jnp.moveaxis(out, 0, -2)


def survival(c, steps: int, walk: str = "reference") -> jax.Array:
    """S_t[i] = Pr_i(walk has not reached the sink after t steps), t = 0..steps.

    Shape ...x (steps + 1) x T; the sink's column is 0. It is also the total-variation
    distance to the absorbed state, which is what `tv_mixing_time` thresholds.
    """
    c, steps, walk = _walk_args(c, steps, walk)
    return _survival(c, steps, walk)


@functools.partial(jax.jit, static_argnames=("steps", "walk"))
def _survival(c, steps: int, walk: str):
    off_sink = 1 - jax.nn.one_hot(c.shape[-1] - 1, c.shape[-1], dtype=c.dtype)
    s0 = jnp.broadcast_to(off_sink, c.shape[:-1])
    rest = row_powers(s0, operators.walk_columns(c, walk), steps, off_sink)
    return jnp.concatenate([s0[..., None, :], rest], axis=-2)


def node_fidelity(c, horizon: int = 100) -> jax.Array:
    """phi_j = max_{1<=t<=horizon} s_t[j], shape ...xT."""
    c = operators.check_operator(c)
    horizon = checks.positive_int("horizon", horizon)
    return fused.sweep(c, horizon=horizon).node_fidelity


def minimax_fidelity(c, horizon: int = 100) -> jax.Array:
    """min_j phi_j over all T tokens (the sink included), shape `...`."""
    c = operators.check_operator(c)
    return early_stop.minimax(c, checks.positive_int("horizon", horizon))


def objective_unchecked(
    c, objective: str, horizon: int, max_steps: int, walk: str, causal: bool | None = None
):
    """Minimax fidelity ("fidelity") or hitting time ("hitting_time") of operators known to
    be row-stochastic (e.g. mixes of attention already checked), without the validation
    pass over every entry: a search scores thousands of mixes of the same checked heads.
    `causal`: whether they are lower triangular, when the caller knows (mixes of causal
    heads are causal); None checks it, a pass over every entry."""
    c = operators.spread(c)
    if objective == "fidelity":
        return early_stop.minimax(c, horizon, causal)
    return early_stop.hitting(c, max_steps, walk, causal)


def hitting_time(
    c, max_steps: int = 100, walk: str = "reference", validate: bool = True
) -> jax.Array:
    """Mean over all T starts of E[min(steps to the sink, max_steps)] (the paper's mixing
    time). `validate` False: as in `operator_metrics`."""
    c, max_steps, walk = _walk_args(c, max_steps, walk, validate)
    return early_stop.hitting(c, max_steps, walk)


def tv_mixing_time(c, eps: float = 0.25, max_steps: int = 100, walk: str = "reference"):
    """min{t : max_i S_t[i] <= eps}; max_steps + 1 when not reached. int32."""
    c, max_steps, walk = _walk_args(c, max_steps, walk)
    eps = checks.open_unit_interval("eps", eps)
    sweep = fused.sweep(c, horizon=0, walks=(walk,), max_steps=max_steps, eps=eps)
    return sweep.tv_mixing_time[..., 0]


def _spectral_radius(c, *, walk: str):
    return fused.sweep(c, horizon=0, walks=(walk,), spectral=True).spectral_radius[..., 0]


def spectral_radius(c, walk: str = "reference") -> jax.Array:
    """Spectral radius rho of Q, the walk with the sink's row and column removed."""
    walk = operators.check_walk(walk)
    return _spectral_radius(operators.check_operator(c), walk=walk)


def relaxation_time(c, walk: str = "reference") -> jax.Array:
    """1 / (1 - rho); infinite when the sink is unreachable from some token."""
    rho = spectral_radius(c, walk)
    return jnp.where(rho < 1, 1 / jnp.where(rho < 1, 1 - rho, 1), jnp.inf).astype(rho.dtype)


def spectral_mixing_time(c, eps: float = 0.25, max_steps: int = 100, walk: str = "reference"):
    """ln(1/eps) / ln(1/rho): 0 when rho = 0, capped at max_steps."""
    c, max_steps, walk = _walk_args(c, max_steps, walk)
    eps = checks.open_unit_interval("eps", eps)
    return spectral.mixing_from_radius(_spectral_radius(c, walk=walk), eps, max_steps)


def operator_metrics(
    c,
    horizon: int = 100,
    max_steps: int = 100,
    eps: float = 0.25,
    walk: str = "reference",
    validate: bool = True,
) -> OperatorMetrics:
    """All metrics of operators `...xTxT` in one pass over each cache block. `validate`
    False skips the pass over every entry, for operators already checked (an analysis
    checks a layer's attention once, then measures it and its mixes several ways)."""
    return metrics_by_walk(c, horizon, max_steps, eps, (walk,), validate)[0][walk]


def metrics_by_walk(
    c,
    horizon: int = 100,
    max_steps: int = 100,
    eps: float = 0.25,
    walks: tuple[str, ...] = operators.WALKS,
    validate: bool = True,
    signal: bool = False,
    causal: bool | None = None,
) -> tuple[dict[str, OperatorMetrics], jax.Array | None]:
    """({walk: OperatorMetrics}, sink signal or None): `operator_metrics` of every walk in
    `walks` from one pass (fidelity is the same for all), and with `signal` the sink
    signal s_t for t = 1..horizon (...x horizon x T) that the fidelity maximises.
    `causal`: whether every operator is lower triangular, when the caller knows (mixes
    and sub-graphs of causal attention it checked); None checks it (one pass over `c`)."""
    walks = tuple(operators.check_walk(w) for w in walks)
    if not walks or len(set(walks)) != len(walks):
        raise ValueError(
            f"walks must name each walk of {operators.WALKS} at most once, got {walks}"
        )
    c, max_steps, _ = _walk_args(c, max_steps, walks[0], validate)
    horizon = checks.positive_int("horizon", horizon)
    eps = checks.open_unit_interval("eps", eps)
    sweep = fused.sweep(
        c,
        horizon=horizon,
        walks=walks,
        max_steps=max_steps,
        eps=eps,
        spectral=True,
        signal=signal,
        causal=causal,
    )
    return _by_walk(sweep, walks=walks, eps=eps, max_steps=max_steps), sweep.sink_signal


@functools.partial(jax.jit, static_argnames=("walks", "eps", "max_steps"))
def _by_walk(sweep: fused.Sweep, *, walks, eps, max_steps) -> dict[str, OperatorMetrics]:
    """Each walk's metrics out of one sweep, in one call: op by op, these small arrays
    would each pay a dispatch (about a hundred per analysed layer)."""
    minimax = jnp.min(sweep.node_fidelity, axis=-1)
    by_walk = {}
    for i, walk in enumerate(walks):
        rho = sweep.spectral_radius[..., i]
        by_walk[walk] = OperatorMetrics(
            node_fidelity=sweep.node_fidelity,
            minimax_fidelity=minimax,
            hitting_time=sweep.hitting_time[..., i],
            tv_mixing_time=sweep.tv_mixing_time[..., i],
            spectral_radius=rho,
            spectral_mixing_time=spectral.mixing_from_radius(rho, eps, max_steps),
        )
    return by_walk


def _walk_args(c, max_steps, walk, validate: bool = True):
    walk = operators.check_walk(walk)
    max_steps = checks.positive_int("max_steps", max_steps)
    return (
        (operators.check_operator(c) if validate else operators.spread(jnp.asarray(c))),
        max_steps,
        walk,
    )


def monte_carlo_hitting_time(
    key,
    c,
    num_walks: int = 500,
    max_steps: int = 100,
    walk: str = "reference",
    return_stderr: bool = False,
):
    """Sampled estimate of `hitting_time`: `num_walks` walks from every token.

    The paper's method, vectorised over walks; with `return_stderr` also the standard
    error of the estimate (starts are independent strata of equal weight).
    """
    c, max_steps, walk = _walk_args(c, max_steps, walk)
    num_walks = checks.positive_int("num_walks", num_walks)
    mean, stderr = _monte_carlo(key, c, num_walks=num_walks, max_steps=max_steps, walk=walk)
    return (mean, stderr) if return_stderr else mean


@functools.partial(jax.jit, static_argnames=("num_walks", "max_steps", "walk"))
def _monte_carlo(key, c, *, num_walks: int, max_steps: int, walk: str):
    lead, t = c.shape[:-2], c.shape[-1]
    flat = c.reshape(-1, t, t)
    keys = jax.random.split(key, flat.shape[0])

    def one(args):
        k, op = args
        cdf = jnp.cumsum(jnp.swapaxes(operators.walk_columns(op, walk), -1, -2), axis=-1)
        cdf = cdf.at[:, -1].set(jnp.inf)  # rounding never walks off the end
        state0 = jnp.broadcast_to(jnp.arange(t)[:, None], (t, num_walks))

        def step(carry, k_step):
            state, steps = carry
            u = jax.random.uniform(k_step, state.shape, op.dtype)
            nxt = jnp.sum(cdf[state] <= u[..., None], axis=-1)
            moving = state != t - 1
            return (jnp.where(moving, nxt, state), steps + moving), None

        init = (state0, jnp.zeros((t, num_walks), jnp.int32))
        (_, steps), _ = lax.scan(step, init, jax.random.split(k, max_steps))
        steps = steps.astype(op.dtype)
        var = jnp.var(steps, axis=1, ddof=1) if num_walks > 1 else jnp.zeros(t, op.dtype)
        return jnp.mean(steps), jnp.sqrt(jnp.sum(var / num_walks)) / t

    mean, stderr = lax.map(one, (keys, flat))
    return mean.reshape(lead), stderr.reshape(lead)
