"""The fused sweep: the sink signal and every walk's survival vector advanced together.

Each quantity is a K-step vector recursion per matrix (2 K T^2 flop). The fidelity
vector and the walks' survival vectors are advanced in one pass; recursions that share
a matrix share its product (with the normalised walk, the sink signal's c). Long causal
operators take a triangular path that never multiplies the zeros above the diagonal.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from beyondpar.metrics import batching, operators
from beyondpar.metrics.spectral import spectral_radius_of

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


class Sweep(NamedTuple):
    """What one sweep gives, each None when not asked for."""

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


def _sweep_block(c, *, horizon, walks, max_steps, eps, spectral, signal, causal, tile) -> Sweep:
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
        on_c.append((off_sink, operators.normalized_scale(c) * off_sink))
    groups = [_Rows(c, *(jnp.stack(x, axis=1) for x in zip(*on_c, strict=True)))] if on_c else []
    columns = {}
    if "reference" in walks and (max_steps or (spectral and not causal)):
        columns["reference"] = operators.walk_columns(c, "reference")
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
        rho = jnp.stack([spectral_radius_of(c, w, columns, causal) for w in walks], axis=-1)
    return Sweep(fidelity, hit, tv, rho, signal_path)


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


def _walk_times(survival_BxKxT, max_steps: int, eps: float):
    """Hitting time (mean over starts of sum_{t < max_steps} S_t) and TV mixing time
    (first t <= max_steps with max_i S_t[i] <= eps, else max_steps + 1) of survival paths."""
    t = survival_BxKxT.shape[-1]
    hit = jnp.sum(survival_BxKxT[:, :max_steps], axis=(1, 2)) / t
    worst = jnp.max(survival_BxKxT[:, 1 : max_steps + 1], axis=-1)
    mixed = worst <= eps
    first = jnp.argmax(mixed, axis=-1).astype(jnp.int32) + 1
    return hit, jnp.where(jnp.any(mixed, axis=-1), first, max_steps + 1)


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


def sweep(
    c,
    *,
    horizon: int,
    walks: tuple[str, ...] = (),
    max_steps: int = 0,
    eps: float = 0.25,
    spectral: bool = False,
    signal: bool = False,
    causal: bool | None = None,
) -> Sweep:
    """One pass over `c` for what is asked (horizon 0 skips fidelity, max_steps 0 the walks),
    on the triangular path when `c` is causal (None: checked here, one pass over `c`), with
    the batch split over threads when JAX has one CPU device."""
    settings = dict(horizon=horizon, walks=walks, max_steps=max_steps, eps=eps)
    # Known-causal operators have triangular walks: their spectral radius is a diagonal.
    long = c.shape[-1] >= _triangular_min_tokens(horizon, walks if max_steps else ())
    if causal is None:
        causal = (spectral or long) and operators.is_causal(c)
    tile = _tile(c.shape[-1]) if causal and long else None
    settings.update(spectral=spectral, signal=signal, causal=causal, tile=tile)
    return batching.threaded(functools.partial(_sweep_jit, **settings), c)


def _triangular_min_tokens(horizon: int, walks: tuple[str, ...]) -> int:
    """The shortest causal operators whose sweep is faster triangular: later when the sink
    signal and the normalised walk are the only recursions, as they share c."""
    shares_c = bool(horizon) and tuple(walks) == ("normalized",)
    return TRIANGULAR_SHARED_MIN_TOKENS if shares_c else TRIANGULAR_MIN_TOKENS


def triangular_tile(c) -> int | None:
    """Column tile of the triangular path for causal operators `c` long enough to gain
    from it, else None (the dense path). Inside a user's jit the dense path runs."""
    t = c.shape[-1]
    if t < TRIANGULAR_MIN_TOKENS or not operators.is_causal(c):
        return None
    return _tile(t)


def _tile(t: int) -> int:
    return -(-t // TRIANGULAR_TILES)


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
def _sweep_jit(c, **settings) -> Sweep:
    """`_sweep_block` over `c` in cache blocks spread over the local devices. The
    triangular path keeps every step of its recursions (3 at most) in cache, not the
    matrix."""
    fn = functools.partial(_sweep_block, **settings)
    if not settings["tile"]:
        return batching.map_blocks(fn, c)
    steps = max(settings["horizon"], settings["max_steps"])
    paths = 3 * (steps + 1) * c.shape[-1] * c.dtype.itemsize
    return batching.map_blocks(fn, c, block_bytes=paths, budget=TRIANGULAR_BLOCK_BYTES)
