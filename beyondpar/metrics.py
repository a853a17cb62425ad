"""Exact, jitted, batched kernels for how information moves to the sink of an operator.

Every kernel takes row-stochastic operators `c` of shape `...xTxT` (rows: queries that
read, columns: keys that are read; the sink is the last token tau = T - 1) and returns
one value per operator (or per token). Definitions: the README's "Metric definitions".

Speed: each quantity is a K-step vector recursion per matrix (2 K T^2 flop). Streaming
every matrix from memory once per step leaves a CPU idle on memory bandwidth, so on CPU
the batch is cut into blocks of a few matrices that stay in cache for the whole horizon,
and the blocks are spread over all local devices. The fidelity vector and the walk's
survival vector are advanced in the same pass; with the normalised walk they even share
the matrix, since both are row vectors times `c`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from beyondpar.base import checks, parallel

WALKS = ("reference", "normalized")
ROW_SUM_TOLERANCE = 1e-4
POWER_ITERATIONS = 1000
# Matrices per cache block on CPU: 10 float32 100x100 operators (400 KB) fit in L2; larger
# matrices get fewer per block (one 1024 x 1024 operator, 4 MB, still sits in L3).
CPU_BLOCK = 10
CPU_BLOCK_BYTES = 512 * 1024


class OperatorMetrics(NamedTuple):
    """Everything the evaluation needs from one operator, computed in one pass."""

    node_fidelity: jax.Array  # ...xT
    minimax_fidelity: jax.Array  # ...
    hitting_time: jax.Array  # ...
    tv_mixing_time: jax.Array  # ... (int32)
    spectral_radius: jax.Array  # ...
    spectral_mixing_time: jax.Array  # ...


# ---------------------------------------------------------------- validation


@jax.jit
def _operator_stats(c):
    finite = jnp.all(jnp.isfinite(c))
    return finite, jnp.min(c), jnp.max(jnp.abs(jnp.sum(c, axis=-1) - 1))


def _spread(c):
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
    """`c` as a float array after checking it is a batch of row-stochastic T x T operators."""
    c = checks.as_float_array(name, c)
    if c.ndim < 2 or c.shape[-1] != c.shape[-2]:
        raise ValueError(f"{name} must have shape (..., T, T) with square matrices, got {c.shape}")
    if c.shape[-1] < 2:
        raise ValueError(f"{name} must have at least T=2 tokens, got T={c.shape[-1]}")
    if c.size and checks.is_concrete(c):
        stats = np.asarray(_in_threads(_operator_stats, c), np.float64)  # parts x 3
        finite, minimum, row_error = stats[:, 0].all(), stats[:, 1].min(), stats[:, 2].max()
        if not finite:
            raise ValueError(f"{name} must be finite, got NaN or Inf entries")
        if minimum < 0:
            raise ValueError(f"{name} must be non-negative, got minimum entry {minimum:.3g}")
        if row_error > ROW_SUM_TOLERANCE:
            raise ValueError(
                f"{name} rows must sum to 1 (tolerance {ROW_SUM_TOLERANCE}), "
                f"got a row off by {row_error:.3g}"
            )
    return _spread(c)


def _check_walk(walk: str) -> str:
    return checks.one_of("walk", walk, WALKS)


# ---------------------------------------------------------------- walk operators


def _walk_columns(c, walk: str):
    """Walk law in column form: W[..., j, i] = P[i, j], the step from token i to j.

    Row vectors times W advance the survival vector, like row vectors times c advance the
    sink signal. Column i of W is built from column i of c.
    """
    tau = c.shape[-1] - 1
    sink = jax.nn.one_hot(tau, c.shape[-1], dtype=c.dtype)
    if walk == "reference":
        # The paper's sampler walks the unnormalised column: clipped cumulative mass,
        # with the shortfall sent to the sink.
        cum = jnp.minimum(1.0, _prefix_sum_rows(c))
        w = jnp.diff(cum, axis=-2, prepend=jnp.zeros_like(cum[..., :1, :]))
        shortfall = 1.0 - cum[..., -1:, :]
        w = w + sink[:, None] * shortfall
    else:
        mass = jnp.sum(c, axis=-2, keepdims=True)
        # A token nobody reads has no way on: it jumps straight to the sink.
        w = jnp.where(mass > 0, c / jnp.where(mass > 0, mass, 1), sink[:, None])
    # The sink is absorbing.
    return w.at[..., :, tau].set(sink)


def _prefix_sum_rows(c):
    """Cumulative sum down each column (axis -2).

    XLA's cumsum does O(T) work per element on CPU. There a running sum over the rows of
    a cache block is cheapest; accelerators get one GEMM with a triangle of ones.
    """
    t = c.shape[-2]
    rows_first = jnp.moveaxis(c, -2, 0)
    if jax.default_backend() == "cpu":
        running = lambda acc, row: (acc + row, acc + row)
        _, summed = lax.scan(running, jnp.zeros_like(rows_first[0]), rows_first)
        return jnp.moveaxis(summed, 0, -2)
    ones = jnp.tril(jnp.ones((t, t), c.dtype))
    summed = jnp.dot(ones, rows_first.reshape(t, -1), precision=lax.Precision.HIGHEST)
    return jnp.moveaxis(summed.reshape(rows_first.shape), 0, -2)


def transition_matrix(c, walk: str = "reference") -> jax.Array:
    """Forward walk P (rows: from key i, columns: to query j) of operators `...xTxT`."""
    walk = _check_walk(walk)
    c = check_operator(c)
    return jnp.swapaxes(_walk_columns(c, walk), -1, -2)


# ---------------------------------------------------------------- batching


def _block_size(matrix_bytes: int) -> int | None:
    # Accelerators want the whole batch in one wide step; CPUs want it in cache.
    if jax.default_backend() != "cpu":
        return None
    return max(1, min(CPU_BLOCK, CPU_BLOCK_BYTES // matrix_bytes))


def _map_batch(block_fn, c_NxTxT, *extras):
    """Apply `block_fn` (b x T x T [, b x ...] -> pytree of b x ...) over N operators in cache
    blocks and across local devices; `extras` are arrays with the same leading N that travel
    with their operator. Padding uses identity operators (zero extras) and is dropped."""
    n, t = c_NxTxT.shape[0], c_NxTxT.shape[-1]
    mesh = parallel.local_mesh(n)
    devices = 1 if mesh is None else mesh.size
    block = _block_size(t * t * c_NxTxT.dtype.itemsize) or -(-n // devices)
    per_device = -(-n // devices)
    block = min(block, per_device)
    padded = devices * block * -(-per_device // block)
    if padded > n:
        pad = jnp.broadcast_to(jnp.eye(t, dtype=c_NxTxT.dtype), (padded - n, t, t))
        c_NxTxT = jnp.concatenate([c_NxTxT, pad])
        extras = tuple(
            jnp.concatenate([x, jnp.zeros((padded - n, *x.shape[1:]), x.dtype)]) for x in extras
        )

    def run_local(*arrays):
        if arrays[0].shape[0] == block:
            return block_fn(*arrays)
        blocks = tuple(x.reshape(-1, block, *x.shape[1:]) for x in arrays)
        out = lax.map(lambda xs: block_fn(*xs), blocks)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    if mesh is not None:
        run_local = jax.shard_map(
            run_local,
            mesh=mesh,
            in_specs=(P(parallel.DATA),) * (1 + len(extras)),
            out_specs=P(parallel.DATA),
            check_vma=False,
        )
    out = run_local(c_NxTxT, *extras)
    return jax.tree.map(lambda x: x[:n], out)


def map_blocks(block_fn, c, *extras):
    """Run `block_fn` over the operators `c` (...xTxT) in cache blocks spread over local
    devices, as the kernels do; `extras` (... x anything) travel with their operator.
    For code built on the kernels' batching (see `weighting`)."""
    lead = c.shape[:-2]
    flat = c.reshape(-1, *c.shape[-2:])
    if flat.shape[0] == 0:
        raise ValueError(f"c must hold at least one matrix, got shape {c.shape}")
    extras = tuple(x.reshape(flat.shape[0], *x.shape[len(lead) :]) for x in extras)
    out = _map_batch(block_fn, flat, *extras)
    return jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), out)


# ---------------------------------------------------------------- the recursion


class _Sweep(NamedTuple):
    node_fidelity: jax.Array | None
    hitting_time: jax.Array | None
    tv_mixing_time: jax.Array | None
    spectral_radius: jax.Array | None


def _sweep_block(
    c, *, horizon: int, walk: str, max_steps: int, eps: float, spectral: bool
) -> _Sweep:
    """Advance the sink signal and the walk's survival vector together over a block.

    Row 0 (when horizon > 0): s_t = s_{t-1} c, s_0 = e_tau. Row 1 (when max_steps > 0):
    S_t = S_{t-1} W with the sink's entry held at 0, S_0 = 1 off the sink. Extra rows
    against a matrix already in cache are almost free, so the two share one product
    whenever they share the matrix (the normalised walk is c with columns rescaled).
    """
    b, t = c.shape[0], c.shape[-1]
    tau = t - 1
    dtype = c.dtype
    sink = jax.nn.one_hot(tau, t, dtype=dtype)
    off_sink = 1 - sink
    walking = max_steps > 0
    walk_cols = None
    if (walking and walk == "reference") or spectral:
        walk_cols = _walk_columns(c, walk)
    rows, scales, mats = [], [], []
    if horizon:
        rows.append(sink)
        scales.append(jnp.ones((b, t), dtype))
        mats.append(c)
    if walking and walk == "normalized":
        mass = jnp.sum(c, axis=-2)
        rows.append(off_sink)
        scales.append(jnp.where(mass > 0, 1 / jnp.where(mass > 0, mass, 1), 0) * off_sink)
        mats.append(c)
    elif walking:
        rows.append(off_sink)
        scales.append(jnp.broadcast_to(off_sink, (b, t)))
        mats.append(walk_cols)
    best = hit = tv = None
    if rows:
        best, hit, tv = _iterate(
            jnp.stack(rows), jnp.stack(scales, axis=1), mats, horizon, max_steps, eps
        )
    rho = _spectral_radius_cols(walk_cols) if spectral else None
    return _Sweep(best, None if hit is None else hit / t, tv, rho)


def _iterate(rows, scale, mats, horizon, max_steps, eps):
    b, t = scale.shape[0], scale.shape[-1]
    shared = all(m is mats[0] for m in mats)
    mat = mats[0] if shared else jnp.stack(mats, axis=1)
    spec = "bri,bij->brj" if shared else "bri,brij->brj"
    walk_row = rows.shape[0] - 1
    dtype = scale.dtype
    steps = max(horizon, max_steps)

    def body(step, carry):
        v, best, hit, tv = carry
        v = jnp.einsum(spec, v, mat, precision=lax.Precision.HIGHEST) * scale
        if horizon:
            best = jnp.where(step <= horizon, jnp.maximum(best, v[:, 0]), best)
        if max_steps:
            survival = v[:, walk_row]
            hit = hit + jnp.where(step < max_steps, jnp.sum(survival, -1), 0)
            mixed = (jnp.max(survival, -1) <= eps) & (tv > max_steps) & (step <= max_steps)
            tv = jnp.where(mixed, step, tv)
        return v, best, hit, tv

    init = (
        jnp.broadcast_to(rows, (b, *rows.shape)),
        jnp.zeros((b, t), dtype),
        jnp.full((b,), t - 1, dtype),  # S_0 summed over the T - 1 non-sink starts
        jnp.full((b,), max_steps + 1, jnp.int32),
    )
    _, best, hit, tv = lax.fori_loop(1, steps + 1, body, init)
    if not max_steps:
        hit = tv = None
    return (best if horizon else None), hit, tv


def _sweep(c, **settings) -> _Sweep:
    """`_sweep_jit`, with the batch split over threads when JAX has one CPU device."""
    outs = _in_threads(functools.partial(_sweep_jit, **settings), c)
    if len(outs) == 1:
        return outs[0]
    joined = jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
    return jax.tree.map(lambda x: x.reshape(*c.shape[:-2], *x.shape[1:]), joined)


def _in_threads(fn, c) -> list:
    """[fn(c)], or fn of one part of the flattened batch per thread.

    A plain Python session or notebook that never asked for one device per core gets one
    CPU device, and one XLA call on it runs on one core. Executions on one CPU device do run
    concurrently, so a batch cut into one part per core and dispatched from that many
    threads uses the whole machine, as the launchers' per-core devices do.
    """
    parts = _thread_parts(c)
    if parts < 2:
        return [fn(c)]
    # NumPy views of the CPU buffer: slicing a jax.Array would copy the whole batch first.
    chunks = np.array_split(np.asarray(c).reshape(-1, *c.shape[-2:]), parts)
    with concurrent.futures.ThreadPoolExecutor(parts) as pool:
        return list(pool.map(lambda x: jax.block_until_ready(fn(x)), chunks))


def _thread_parts(c) -> int:
    """Threads worth using for a batch: one per core, each with at least two cache blocks."""
    if not checks.is_concrete(c) or jax.default_backend() != "cpu":
        return 1
    if len(jax.local_devices()) > 1:
        return 1  # the batch is already spread over per-core devices
    n = math.prod(c.shape[:-2])
    block = _block_size(c.shape[-1] ** 2 * c.dtype.itemsize) or 1
    return max(1, min(os.cpu_count() or 1, n // (2 * block)))


@functools.partial(jax.jit, static_argnames=("horizon", "walk", "max_steps", "eps", "spectral"))
def _sweep_jit(
    c, *, horizon: int, walk: str, max_steps: int, eps: float = 0.25, spectral: bool = False
) -> _Sweep:
    """One pass over `c` for what is asked: horizon 0 skips fidelity, max_steps 0 the walk."""
    fn = functools.partial(
        _sweep_block, horizon=horizon, walk=walk, max_steps=max_steps, eps=eps, spectral=spectral
    )
    return map_blocks(fn, c)


# ---------------------------------------------------------------- spectral


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


def _spectral_radius(c, *, walk: str):
    return _sweep(c, horizon=0, walk=walk, max_steps=0, spectral=True).spectral_radius


def _mixing_from_radius(rho, eps: float, max_steps: int):
    safe = jnp.clip(rho, 1e-30, 1 - 1e-12)
    estimate = jnp.log(1 / eps) / jnp.log(1 / safe)
    estimate = jnp.where(rho >= 1, max_steps, jnp.minimum(estimate, max_steps))
    return jnp.where(rho <= 0, 0.0, estimate).astype(rho.dtype)


# ---------------------------------------------------------------- public API


def sink_signal(c, steps: int) -> jax.Array:
    """s_t = e_tau^T c^t for t = 1..steps, shape ...x steps x T: token j's share at the sink."""
    c = check_operator(c)
    steps = checks.positive_int("steps", steps)
    return _sink_signal(c, steps)


def row_powers(v0, mat, steps: int, keep=1):
    """v_t = (v_{t-1} mat) * keep for t = 1..steps, stacked on axis -2."""

    def step(v, _):
        v = jnp.einsum("...i,...ij->...j", v, mat, precision=lax.Precision.HIGHEST) * keep
        return v, v

    _, out = lax.scan(step, v0, None, length=steps)
    return jnp.moveaxis(out, 0, -2)


@functools.partial(jax.jit, static_argnames=("steps",))
def _sink_signal(c, steps: int):
    sink = jax.nn.one_hot(c.shape[-1] - 1, c.shape[-1], dtype=c.dtype)
    return row_powers(jnp.broadcast_to(sink, c.shape[:-1]), c, steps)


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
    rest = row_powers(s0, _walk_columns(c, walk), steps, off_sink)
    return jnp.concatenate([s0[..., None, :], rest], axis=-2)


def node_fidelity(c, horizon: int = 100) -> jax.Array:
    """phi_j = max_{1<=t<=horizon} s_t[j], shape ...xT."""
    c = check_operator(c)
    horizon = checks.positive_int("horizon", horizon)
    return _sweep(c, horizon=horizon, walk="reference", max_steps=0).node_fidelity


def minimax_fidelity(c, horizon: int = 100) -> jax.Array:
    """min_j phi_j over all T tokens (the sink included), shape `...`."""
    return jnp.min(node_fidelity(c, horizon), axis=-1)


def objective_unchecked(c, objective: str, horizon: int, max_steps: int, walk: str):
    """Minimax fidelity ("fidelity") or hitting time ("hitting_time") of operators known to
    be row-stochastic (e.g. mixes of attention already checked), without the validation
    pass over every entry: a search scores thousands of mixes of the same checked heads."""
    c = _spread(c)
    if objective == "fidelity":
        return jnp.min(_sweep(c, horizon=horizon, walk="reference", max_steps=0).node_fidelity, -1)
    return _sweep(c, horizon=0, walk=walk, max_steps=max_steps).hitting_time


def hitting_time(
    c, max_steps: int = 100, walk: str = "reference", validate: bool = True
) -> jax.Array:
    """Mean over all T starts of E[min(steps to the sink, max_steps)] (the paper's mixing
    time). `validate` False: as in `operator_metrics`."""
    c, max_steps, walk = _walk_args(c, max_steps, walk, validate)
    return _sweep(c, horizon=0, walk=walk, max_steps=max_steps).hitting_time


def tv_mixing_time(c, eps: float = 0.25, max_steps: int = 100, walk: str = "reference"):
    """min{t : max_i S_t[i] <= eps}; max_steps + 1 when not reached. int32."""
    c, max_steps, walk = _walk_args(c, max_steps, walk)
    eps = checks.open_unit_interval("eps", eps)
    return _sweep(c, horizon=0, walk=walk, max_steps=max_steps, eps=eps).tv_mixing_time


def spectral_radius(c, walk: str = "reference") -> jax.Array:
    """Spectral radius rho of Q, the walk with the sink's row and column removed."""
    walk = _check_walk(walk)
    return _spectral_radius(check_operator(c), walk=walk)


def relaxation_time(c, walk: str = "reference") -> jax.Array:
    """1 / (1 - rho); infinite when the sink is unreachable from some token."""
    rho = spectral_radius(c, walk)
    return jnp.where(rho < 1, 1 / jnp.where(rho < 1, 1 - rho, 1), jnp.inf).astype(rho.dtype)


def spectral_mixing_time(c, eps: float = 0.25, max_steps: int = 100, walk: str = "reference"):
    """ln(1/eps) / ln(1/rho): 0 when rho = 0, capped at max_steps."""
    c, max_steps, walk = _walk_args(c, max_steps, walk)
    eps = checks.open_unit_interval("eps", eps)
    return _mixing_from_radius(_spectral_radius(c, walk=walk), eps, max_steps)


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
    c, max_steps, walk = _walk_args(c, max_steps, walk, validate)
    horizon = checks.positive_int("horizon", horizon)
    eps = checks.open_unit_interval("eps", eps)
    sweep = _sweep(c, horizon=horizon, walk=walk, max_steps=max_steps, eps=eps, spectral=True)
    rho = sweep.spectral_radius
    return OperatorMetrics(
        node_fidelity=sweep.node_fidelity,
        minimax_fidelity=jnp.min(sweep.node_fidelity, axis=-1),
        hitting_time=sweep.hitting_time,
        tv_mixing_time=sweep.tv_mixing_time,
        spectral_radius=rho,
        spectral_mixing_time=_mixing_from_radius(rho, eps, max_steps),
    )


def _walk_args(c, max_steps, walk, validate: bool = True):
    walk = _check_walk(walk)
    max_steps = checks.positive_int("max_steps", max_steps)
    return (check_operator(c) if validate else _spread(jnp.asarray(c))), max_steps, walk


# ---------------------------------------------------------------- Monte Carlo


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
        cdf = jnp.cumsum(jnp.swapaxes(_walk_columns(op, walk), -1, -2), axis=-1)
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
