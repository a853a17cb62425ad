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
_HIGHEST = lax.Precision.HIGHEST
CPU_BLOCK = 10
CPU_BLOCK_BYTES = 512 * 1024
# Causal operators at least this long take the triangular path, cut into this many column
# tiles; a block keeps the recursions' paths of a few operators (L2 and a share of L3).
# Shorter ones are faster dense on CPU: their tiles are too small for efficient products.
# With a matrix per recursion, the triangular path wins from T = 64 (at T = 100: 1.2x
# for the fidelity with the reference walk, 1.3x for a hitting time); when the sink
# signal and the normalised walk share c, the dense path streams c once for both and
# stays faster until about T = 128 (0.9x at T = 100, 1.1x at T = 128).
TRIANGULAR_MIN_TOKENS = 64
TRIANGULAR_SHARED_MIN_TOKENS = 128
TRIANGULAR_TILES = 4
TRIANGULAR_BLOCK_BYTES = 5 * 512 * 1024
# The early stop of the minimax fidelity keeps this relative margin over float32 rounding.
_SETTLE_MARGIN = 1e-3


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
        stats = np.asarray(_in_threads(_operator_stats, c), np.float64)  # parts x 3
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
        w, clipped_mass = _clipped_steps(c)
        w = w.at[..., tau, :].add(1.0 - clipped_mass)
    else:
        mass = jnp.sum(c, axis=-2, keepdims=True)
        # A token nobody reads has no way on: it jumps straight to the sink.
        w = jnp.where(mass > 0, c / jnp.where(mass > 0, mass, 1), sink[:, None])
    # The sink is absorbing.
    return w.at[..., :, tau].set(sink)


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
    walk = _check_walk(walk)
    c = check_operator(c)
    return jnp.swapaxes(_walk_columns(c, walk), -1, -2)


# ---------------------------------------------------------------- batching


def _block_size(matrix_bytes: int, budget: int = CPU_BLOCK_BYTES) -> int | None:
    # Accelerators want the whole batch in one wide step; CPUs want it in cache.
    if jax.default_backend() != "cpu":
        return None
    return max(1, min(CPU_BLOCK, budget // matrix_bytes))


def _map_batch(block_fn, c_NxTxT, *extras, block_bytes=None, budget=CPU_BLOCK_BYTES):
    """Apply `block_fn` (b x T x T [, b x ...] -> pytree of b x ...) over N operators in cache
    blocks and across local devices; `extras` are arrays with the same leading N that travel
    with their operator. Padding uses identity operators (zero extras) and is dropped.
    `block_bytes`: what one operator keeps in cache (default: its matrix), `budget`: what
    a block may keep."""
    n, t = c_NxTxT.shape[0], c_NxTxT.shape[-1]
    mesh = parallel.local_mesh(n)
    devices = 1 if mesh is None else mesh.size
    block = _block_size(block_bytes or t * t * c_NxTxT.dtype.itemsize, budget)
    block = block or -(-n // devices)
    per_device = -(-n // devices)
    block = _dividing_block(min(block, per_device), per_device)
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


def _dividing_block(block: int, per_device: int) -> int:
    """The largest block of at most `block` (and over half of it) that divides each
    device's share: padding the batch copies all of it and moves it between devices,
    which costs more than a slightly smaller block."""
    fits = [d for d in range(block, block // 2, -1) if per_device % d == 0]
    return fits[0] if fits else block


def map_blocks(block_fn, c, *extras, block_bytes: int | None = None, budget: int = CPU_BLOCK_BYTES):
    """Run `block_fn` over the operators `c` (...xTxT) in cache blocks spread over local
    devices, as the kernels do; `extras` (... x anything) travel with their operator;
    `block_bytes` is what one operator keeps in cache (default: its matrix) and `budget`
    what a block may keep. For code built on the kernels' batching (see `weighting`)."""
    lead = c.shape[:-2]
    flat = c.reshape(-1, *c.shape[-2:])
    if flat.shape[0] == 0:
        raise ValueError(f"c must hold at least one matrix, got shape {c.shape}")
    extras = tuple(x.reshape(flat.shape[0], *x.shape[len(lead) :]) for x in extras)
    out = _map_batch(block_fn, flat, *extras, block_bytes=block_bytes, budget=budget)
    return jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), out)


# ---------------------------------------------------------------- the recursion


class _Sweep(NamedTuple):
    node_fidelity: jax.Array | None  # ...xT
    hitting_time: jax.Array | None  # ...xW, one per walk asked for
    tv_mixing_time: jax.Array | None  # ...xW
    spectral_radius: jax.Array | None  # ...xW
    sink_signal: jax.Array | None  # ...x horizon x T


class _Rows(NamedTuple):
    """Recursions v_t = (v_{t-1} mat) * scale that share one matrix (v0, scale: b x r x T)."""

    mat: jax.Array
    v0: jax.Array
    scale: jax.Array


def _stacked(groups: list[_Rows], roles: dict) -> tuple[list[_Rows], dict]:
    """Groups with as many rows as one another as one batch (their matrices one after the
    other): one product per step instead of one per group, which on CPU halves the small
    operations each step pays for (the sink signal with the reference walk: 77 to 65 us
    per operator at T = 100). Groups with other row counts stay apart: padding their rows
    would cost more products than it saves. Roles (group, row) become (group, part, row),
    for `_role_rows`."""
    by_rows: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_rows.setdefault(g.v0.shape[1], []).append(i)
    merged, where = [], {}
    for members in by_rows.values():
        for part, i in enumerate(members):
            where[i] = (len(merged), part)
        parts = [groups[i] for i in members]
        merged.append(_Rows(*(jnp.concatenate(x) for x in zip(*parts, strict=True))))
    return merged, {role: (*where[g], row) for role, (g, row) in roles.items()}


def _role_rows(xs: list, role: tuple[int, int, int], batch: int):
    """The rows of `role` (group, part, row) out of per-group arrays (parts * batch x rows
    x ...)."""
    group, part, row = role
    return xs[group][part * batch : (part + 1) * batch, row]


def _sweep_block(c, *, horizon, walks, max_steps, eps, spectral, signal, causal, tile) -> _Sweep:
    """Advance the sink signal and every walk's survival vector together over a block.

    Row s_t = s_{t-1} c from s_0 = e_tau (when horizon > 0); per walk (when max_steps > 0)
    S_t = S_{t-1} W with the sink's entry held at 0, from S_0 = 1 off the sink. Rows that
    share a matrix share its product: the normalised walk is c with columns rescaled, so
    it rides with the sink signal; the reference walk has its own matrix.
    """
    b, t = c.shape[0], c.shape[-1]
    sink = jax.nn.one_hot(t - 1, t, dtype=c.dtype)
    off_sink = jnp.broadcast_to(1 - sink, (b, t))
    on_c, roles = [], {}
    if horizon:
        roles["signal"] = (0, len(on_c))
        on_c.append((jnp.broadcast_to(sink, (b, t)), jnp.ones((b, t), c.dtype)))
    if max_steps and "normalized" in walks:
        roles["normalized"] = (0, len(on_c))
        on_c.append((off_sink, _normalized_scale(c) * off_sink))
    groups = [_Rows(c, *(jnp.stack(x, axis=1) for x in zip(*on_c, strict=True)))] if on_c else []
    columns = {}
    if "reference" in walks and (max_steps or (spectral and not causal)):
        columns["reference"] = _walk_columns(c, "reference")
    if max_steps and "reference" in walks:
        roles["reference"] = (len(groups), 0)
        groups.append(_Rows(columns["reference"], off_sink[:, None], off_sink[:, None]))
    settings = dict(horizon=horizon, walks=walks if max_steps else (), max_steps=max_steps)
    sweep = _dense_sweep if tile is None else functools.partial(_triangular_sweep, tile=tile)
    fidelity, hit, tv, signal_path = (
        sweep(*_stacked(groups, roles), batch=b, eps=eps, signal=signal, **settings)
        if groups
        else (None,) * 4
    )
    rho = None
    if spectral and walks:
        rho = jnp.stack([_spectral_radius_of(c, w, columns, causal) for w in walks], axis=-1)
    return _Sweep(fidelity, hit, tv, rho, signal_path)


def _triangular_sweep(groups, roles, *, batch, horizon, walks, max_steps, eps, signal, tile):
    """(node fidelity, hitting times, TV times, sink signal) from every step's vector."""
    paths = _triangular_paths(groups, max(horizon, max_steps), tile)
    row = lambda role: _role_rows(paths, roles[role], batch)
    signal_path = row("signal")[:, 1 : horizon + 1] if horizon else None
    hit = tv = None
    if walks:
        hit, tv = zip(*(_walk_times(row(w), max_steps, eps) for w in walks), strict=True)
        hit, tv = jnp.stack(hit, axis=-1), jnp.stack(tv, axis=-1)
    fidelity = None if signal_path is None else jnp.max(signal_path, axis=1)
    return fidelity, hit, tv, signal_path if signal else None


def _dense_sweep(groups, roles, *, batch, horizon, walks, max_steps, eps, signal):
    """(node fidelity, hitting times, TV times, sink signal), reduced step by step: for
    small T the vectors of every step would cost more to keep than to reduce."""
    b, t = batch, groups[0].v0.shape[-1]
    dtype, hp = groups[0].v0.dtype, lax.Precision.HIGHEST

    def body(step, carry):
        vs, best, hit, tv, path = carry
        vs = tuple(
            jnp.einsum("bri,bij->brj", v, g.mat, precision=hp) * g.scale
            for v, g in zip(vs, groups, strict=True)
        )
        if horizon:
            s = _role_rows(vs, roles["signal"], b)
            best = jnp.where(step <= horizon, jnp.maximum(best, s), best)
            if signal:
                at = jnp.minimum(step, horizon) - 1
                keep = lax.dynamic_index_in_dim(path, at, axis=1, keepdims=False)
                path = lax.dynamic_update_index_in_dim(
                    path, jnp.where(step <= horizon, s, keep), at, axis=1
                )
        hit, tv = list(hit), list(tv)
        for i, walk in enumerate(walks):
            survival = _role_rows(vs, roles[walk], b)
            hit[i] = hit[i] + jnp.where(step < max_steps, jnp.sum(survival, -1), 0)
            mixed = (jnp.max(survival, -1) <= eps) & (tv[i] > max_steps) & (step <= max_steps)
            tv[i] = jnp.where(mixed, step, tv[i])
        return vs, best, tuple(hit), tuple(tv), path

    init = (
        tuple(g.v0 for g in groups),
        jnp.zeros((b, t), dtype),
        (jnp.full((b,), t - 1, dtype),) * len(walks),  # S_0 summed: T - 1 non-sink starts
        (jnp.full((b,), max_steps + 1, jnp.int32),) * len(walks),
        jnp.zeros((b, horizon if signal else 0, t), dtype),
    )
    _, best, hit, tv, path = lax.fori_loop(1, max(horizon, max_steps) + 1, body, init)
    return (
        best if horizon else None,
        jnp.stack(hit, axis=-1) / t if walks else None,
        jnp.stack(tv, axis=-1) if walks else None,
        path if signal else None,
    )


def _normalized_scale(c):
    """1 / column mass: row vectors times c, rescaled, step the normalised walk."""
    mass = jnp.sum(c, axis=-2)
    return jnp.where(mass > 0, 1 / jnp.where(mass > 0, mass, 1), 0)


def _walk_times(survival_BxKxT, max_steps: int, eps: float):
    """Hitting time (mean over starts of sum_{t < max_steps} S_t) and TV mixing time
    (first t <= max_steps with max_i S_t[i] <= eps, else max_steps + 1) of survival paths."""
    t = survival_BxKxT.shape[-1]
    hit = jnp.sum(survival_BxKxT[:, :max_steps], axis=(1, 2)) / t
    worst = jnp.max(survival_BxKxT[:, 1 : max_steps + 1], axis=-1)
    mixed = worst <= eps
    first = jnp.argmax(mixed, axis=-1).astype(jnp.int32) + 1
    return hit, jnp.where(jnp.any(mixed, axis=-1), first, max_steps + 1)


def _spectral_radius_of(c, walk, columns, causal: bool):
    """Spectral radius of the walk without the sink; for causal operators the largest
    diagonal entry of the triangular walk, without building (or checking) the walk."""
    if not causal:
        return _spectral_radius_cols(columns[walk] if walk in columns else _walk_columns(c, walk))
    diag = jnp.diagonal(c, axis1=-2, axis2=-1)[:, :-1]
    if walk == "normalized":
        mass = jnp.sum(c, axis=-2)[:, :-1]
        diag = jnp.where(mass > 0, diag / jnp.where(mass > 0, mass, 1), 0)
    else:  # reference: the clipped cumulative mass of column i starts at min(1, c[i, i])
        diag = jnp.minimum(diag, 1)
    return jnp.max(diag, axis=-1)


def _triangular_paths(groups, steps, tile):
    """The recursions for lower-triangular matrices, by column tiles from the last.

    v_t[j] needs v_{t-1}[i] only for i >= j. Once every column right of a tile is known
    for all t, their part of the tile's products is one GEMM over all steps (steps x r
    rows); only the tile's own triangle is stepped one t at a time. Zeros above the
    diagonal are never multiplied, and most of the work runs at matrix-product speed.
    """
    t = groups[0].mat.shape[-1]
    count = -(-t // tile)
    groups = [_pad_rows(g, count * tile - t) for g in groups]
    paths = [
        jnp.zeros((*g.v0.shape[:2], steps + 1, count * tile), g.v0.dtype).at[:, :, 0].set(g.v0)
        for g in groups
    ]
    hp = lax.Precision.HIGHEST
    for j in reversed(range(count)):
        cols, right = slice(j * tile, (j + 1) * tile), slice((j + 1) * tile, None)
        feed = [None] * len(groups)
        if j < count - 1:
            feed = [
                jnp.einsum(
                    "brki,bij->brkj", p[:, :, :steps, right], g.mat[:, right, cols], precision=hp
                )
                for g, p in zip(groups, paths, strict=True)
            ]
        diag = [(g.mat[:, cols, cols], g.scale[:, :, cols]) for g in groups]

        def body(k, state, feed=feed, diag=diag):
            vs, tiles = state
            new = []
            for v, x, (m, s) in zip(vs, feed, diag, strict=True):
                y = jnp.einsum("bri,bij->brj", v, m, precision=hp)
                if x is not None:
                    y = y + lax.dynamic_index_in_dim(x, k, axis=2, keepdims=False)
                new.append(y * s)
            tiles = tuple(
                lax.dynamic_update_index_in_dim(o, v, k + 1, axis=2)
                for o, v in zip(tiles, new, strict=True)
            )
            return tuple(new), tiles

        start = (tuple(g.v0[:, :, cols] for g in groups), tuple(p[..., cols] for p in paths))
        _, tiles = lax.fori_loop(0, steps, body, start)
        paths = [p.at[..., cols].set(o) for p, o in zip(paths, tiles, strict=True)]
    return [p[..., :t] for p in paths]


def _pad_rows(g: _Rows, pad: int) -> _Rows:
    """Zero tokens after the last: they read nothing and nobody reads them."""
    if not pad:
        return g
    vec = ((0, 0), (0, 0), (0, pad))
    return _Rows(
        jnp.pad(g.mat, ((0, 0), (0, pad), (0, pad))), jnp.pad(g.v0, vec), jnp.pad(g.scale, vec)
    )


def _sweep(
    c,
    *,
    horizon: int,
    walks: tuple[str, ...] = (),
    max_steps: int = 0,
    eps: float = 0.25,
    spectral: bool = False,
    signal: bool = False,
    causal: bool | None = None,
) -> _Sweep:
    """One pass over `c` for what is asked (horizon 0 skips fidelity, max_steps 0 the walks),
    on the triangular path when `c` is causal (None: checked here, one pass over `c`), with
    the batch split over threads when JAX has one CPU device."""
    settings = dict(horizon=horizon, walks=walks, max_steps=max_steps, eps=eps)
    # Known-causal operators have triangular walks: their spectral radius is a diagonal.
    long = c.shape[-1] >= _triangular_min_tokens(horizon, walks if max_steps else ())
    if causal is None:
        causal = (spectral or long) and is_causal(c)
    tile = _tile(c.shape[-1]) if causal and long else None
    settings.update(spectral=spectral, signal=signal, causal=causal, tile=tile)
    return _threaded(functools.partial(_sweep_jit, **settings), c)


def _triangular_min_tokens(horizon: int, walks: tuple[str, ...]) -> int:
    """The shortest causal operators whose sweep is faster triangular: later when the sink
    signal and the normalised walk are the only recursions, as they share c."""
    shares_c = bool(horizon) and tuple(walks) == ("normalized",)
    return TRIANGULAR_SHARED_MIN_TOKENS if shares_c else TRIANGULAR_MIN_TOKENS


def _threaded(fn, c):
    """fn(c) for a jitted kernel over operators `c`, run by `_in_threads` and joined."""
    outs = _in_threads(fn, c)
    if len(outs) == 1:
        return outs[0]
    n = math.prod(c.shape[:-2])  # the last part's padding dropped
    joined = jax.tree.map(lambda *xs: jnp.concatenate(xs)[:n], *outs)
    return jax.tree.map(lambda x: x.reshape(*c.shape[:-2], *x.shape[1:]), joined)


def _minimax(c, horizon: int, causal: bool | None = None) -> jax.Array:
    """Minimax fidelity of row-stochastic operators `c` (...xTxT); causal ones (None:
    checked here) stop their recursion as soon as the minimum is settled
    (`_settled_minimax`)."""
    if not (is_causal(c) if causal is None else causal):
        return jnp.min(_sweep(c, horizon=horizon, causal=False).node_fidelity, -1)
    return _threaded(functools.partial(_settled_minimax_jit, horizon=horizon), c)


@functools.partial(jax.jit, static_argnames="horizon")
def _settled_minimax_jit(c, *, horizon: int) -> jax.Array:
    return map_blocks(functools.partial(_settled_minimax, horizon=horizon), c)


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


def _hitting(c, max_steps: int, walk: str, causal: bool | None = None) -> jax.Array:
    """Hitting time of row-stochastic operators `c` (...xTxT) on `walk`: long causal ones
    (None: checked when long) on the triangular path, the rest in a loop that stops once
    every later step would add nothing (`_settled_hitting_time`)."""
    if c.shape[-1] >= TRIANGULAR_MIN_TOKENS and (is_causal(c) if causal is None else causal):
        sweep = _sweep(c, horizon=0, walks=(walk,), max_steps=max_steps, causal=True)
        return sweep.hitting_time[..., 0]
    return _threaded(functools.partial(_settled_hitting_jit, max_steps=max_steps, walk=walk), c)


@functools.partial(jax.jit, static_argnames=("max_steps", "walk", "settle"))
def _settled_hitting_jit(c, *, max_steps: int, walk: str, settle: bool = True) -> jax.Array:
    run = functools.partial(_settled_hitting_time, max_steps=max_steps, walk=walk, settle=settle)
    return map_blocks(run, c)


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
        mat, scale = _walk_columns(c, "reference"), off_sink[:, None]
    else:
        mat, scale = c, (_normalized_scale(c) * off_sink)[:, None]
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


@jax.jit
def _lower_triangular(c):
    return jnp.all(jnp.triu(c, 1) == 0)


def is_causal(c) -> bool:
    """Whether every matrix of `c` (...xTxT, concrete) is lower triangular: a token reads
    only itself and earlier tokens. One pass over the entries; False for traced arrays."""
    return checks.is_concrete(c) and c.size > 0 and bool(_lower_triangular(c))


def triangular_tile(c) -> int | None:
    """Column tile of the triangular path for causal operators `c` long enough to gain
    from it, else None (the dense path). Inside a user's jit the dense path runs."""
    t = c.shape[-1]
    if t < TRIANGULAR_MIN_TOKENS or not is_causal(c):
        return None
    return _tile(t)


def _tile(t: int) -> int:
    return -(-t // TRIANGULAR_TILES)


def _in_threads(fn, c) -> list:
    """[fn(c)], or fn of one part of the flattened batch per thread, the parts of equal
    size (the last padded, see `_threaded`).

    A plain Python session or notebook that never asked for one device per core gets one
    CPU device, and one XLA call on it runs on one core. Executions on one CPU device do run
    concurrently, so a batch cut into one part per core and dispatched from that many
    threads uses the whole machine, as the launchers' per-core devices do.
    """
    parts = _thread_parts(c)
    if parts < 2:
        return [fn(c)]
    # NumPy views of the CPU buffer: slicing a jax.Array would copy the whole batch first.
    flat = np.asarray(c).reshape(-1, *c.shape[-2:])
    size = -(-len(flat) // parts)
    chunks = [flat[i : i + size] for i in range(0, len(flat), size)]
    # Parts of one size share one compiled kernel: the last is padded with copies of the
    # batch's last operator (valid wherever the batch is), whose results are dropped.
    short = size - len(chunks[-1])
    if short:
        chunks[-1] = np.concatenate([chunks[-1], np.repeat(flat[-1:], short, axis=0)])
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


@functools.partial(
    jax.jit,
    static_argnames=(
        "horizon",
        "walks",
        "max_steps",
        "eps",
        "spectral",
        "signal",
        "causal",
        "tile",
    ),
)
def _sweep_jit(c, **settings) -> _Sweep:
    """`_sweep_block` over `c` in cache blocks spread over the local devices. The
    triangular path keeps every step of its recursions (3 at most) in cache, not the
    matrix."""
    fn = functools.partial(_sweep_block, **settings)
    if not settings["tile"]:
        return map_blocks(fn, c)
    steps = max(settings["horizon"], settings["max_steps"])
    paths = 3 * (steps + 1) * c.shape[-1] * c.dtype.itemsize
    return map_blocks(fn, c, block_bytes=paths, budget=TRIANGULAR_BLOCK_BYTES)


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
    return _sweep(c, horizon=0, walks=(walk,), spectral=True).spectral_radius[..., 0]


def _mixing_from_radius(rho, eps: float, max_steps: int):
    safe = jnp.clip(rho, 1e-30, 1 - 1e-12)
    estimate = jnp.log(1 / eps) / jnp.log(1 / safe)
    estimate = jnp.where(rho >= 1, max_steps, jnp.minimum(estimate, max_steps))
    return jnp.where(rho <= 0, 0.0, estimate).astype(rho.dtype)


# ---------------------------------------------------------------- public API


def sink_signal(c, steps: int, validate: bool = True) -> jax.Array:
    """s_t = e_tau^T c^t for t = 1..steps, shape ...x steps x T: token j's share at the sink.
    `validate` False: as in `operator_metrics`."""
    c = check_operator(c) if validate else _spread(jnp.asarray(c))
    steps = checks.positive_int("steps", steps)
    return _sweep(c, horizon=steps, signal=True).sink_signal


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
    rest = row_powers(s0, _walk_columns(c, walk), steps, off_sink)
    return jnp.concatenate([s0[..., None, :], rest], axis=-2)


def node_fidelity(c, horizon: int = 100) -> jax.Array:
    """phi_j = max_{1<=t<=horizon} s_t[j], shape ...xT."""
    c = check_operator(c)
    horizon = checks.positive_int("horizon", horizon)
    return _sweep(c, horizon=horizon).node_fidelity


def minimax_fidelity(c, horizon: int = 100) -> jax.Array:
    """min_j phi_j over all T tokens (the sink included), shape `...`."""
    c = check_operator(c)
    return _minimax(c, checks.positive_int("horizon", horizon))


def objective_unchecked(
    c, objective: str, horizon: int, max_steps: int, walk: str, causal: bool | None = None
):
    """Minimax fidelity ("fidelity") or hitting time ("hitting_time") of operators known to
    be row-stochastic (e.g. mixes of attention already checked), without the validation
    pass over every entry: a search scores thousands of mixes of the same checked heads.
    `causal`: whether they are lower triangular, when the caller knows (mixes of causal
    heads are causal); None checks it, a pass over every entry."""
    c = _spread(c)
    if objective == "fidelity":
        return _minimax(c, horizon, causal)
    return _hitting(c, max_steps, walk, causal)


def hitting_time(
    c, max_steps: int = 100, walk: str = "reference", validate: bool = True
) -> jax.Array:
    """Mean over all T starts of E[min(steps to the sink, max_steps)] (the paper's mixing
    time). `validate` False: as in `operator_metrics`."""
    c, max_steps, walk = _walk_args(c, max_steps, walk, validate)
    return _hitting(c, max_steps, walk)


def tv_mixing_time(c, eps: float = 0.25, max_steps: int = 100, walk: str = "reference"):
    """min{t : max_i S_t[i] <= eps}; max_steps + 1 when not reached. int32."""
    c, max_steps, walk = _walk_args(c, max_steps, walk)
    eps = checks.open_unit_interval("eps", eps)
    sweep = _sweep(c, horizon=0, walks=(walk,), max_steps=max_steps, eps=eps)
    return sweep.tv_mixing_time[..., 0]


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
    return metrics_by_walk(c, horizon, max_steps, eps, (walk,), validate)[0][walk]


def metrics_by_walk(
    c,
    horizon: int = 100,
    max_steps: int = 100,
    eps: float = 0.25,
    walks: tuple[str, ...] = WALKS,
    validate: bool = True,
    signal: bool = False,
    causal: bool | None = None,
) -> tuple[dict[str, OperatorMetrics], jax.Array | None]:
    """({walk: OperatorMetrics}, sink signal or None): `operator_metrics` of every walk in
    `walks` from one pass (fidelity is the same for all), and with `signal` the sink
    signal s_t for t = 1..horizon (...x horizon x T) that the fidelity maximises.
    `causal`: whether every operator is lower triangular, when the caller knows (mixes
    and sub-graphs of causal attention it checked); None checks it (one pass over `c`)."""
    walks = tuple(_check_walk(w) for w in walks)
    if not walks or len(set(walks)) != len(walks):
        raise ValueError(f"walks must name each walk of {WALKS} at most once, got {walks}")
    c, max_steps, _ = _walk_args(c, max_steps, walks[0], validate)
    horizon = checks.positive_int("horizon", horizon)
    eps = checks.open_unit_interval("eps", eps)
    sweep = _sweep(
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
def _by_walk(sweep: _Sweep, *, walks, eps, max_steps) -> dict[str, OperatorMetrics]:
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
            spectral_mixing_time=_mixing_from_radius(rho, eps, max_steps),
        )
    return by_walk


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
