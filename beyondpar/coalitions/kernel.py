"""The objective of many mixes of the same heads, each mix formed where it is measured.

Forming every coalition's mix in memory first writes B K T^2 floats and reads them back
(a gigabyte per layer of a 9-head model on 32 windows of 128 tokens), which costs more
than measuring them: minimax fidelity settles within a few steps. Here a block of
coalitions is ONE product, (its normalised mask rows) @ (the sequence's heads), formed
in cache (a block fits the kernels' cache budget on CPU; on an accelerator a memory
budget) and measured at once by the same recursions as the metric kernels
(`metrics.minimax_fidelity`, `metrics.hitting_time`), with the same early stops: each
loop ends once no later step can change its value.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from beyondpar import metrics
from beyondpar.base import parallel
from beyondpar.metrics import operators

_HIGHEST = lax.Precision.HIGHEST
SETTLE_MARGIN = 1e-3  # relative margin of an early stop over float32 rounding
DEVICE_BYTES = 2**30  # mixes in flight at once on an accelerator


def block_size(num_sequences: int, num_tokens: int, itemsize: int) -> int:
    """Coalitions per block: as many mixes as stay in cache on CPU (the metric kernels'
    budget), as fit `DEVICE_BYTES` over all sequences on an accelerator."""
    one = num_tokens * num_tokens * itemsize
    if jax.default_backend() == "cpu":
        return max(1, metrics.CPU_BLOCK_BYTES // one)
    return max(1, DEVICE_BYTES // (one * num_sequences))


def measure_mixes(attn_BxHxTxT, rows_BxKxH, objective: str, horizon: int, walk: str, block: int):
    """(B, K): the objective of the K mixes sum_h rows[b, k, h] attn[b, h] of every
    sequence b. Rows are convex weights of checked (row-stochastic) heads; K a multiple
    of `block`. Sequences are split over local devices (padded to a multiple of them)."""
    run = functools.partial(_measure, objective=objective, horizon=horizon, walk=walk, block=block)
    return over_sequences(run, attn_BxHxTxT, rows_BxKxH)


def over_sequences(run, attn_BxHxTxT, per_sequence, threads: int | None = None) -> jax.Array:
    """run(attn, per_sequence, mesh=...) -> (B, ...) split over the sequences: over local
    devices (padded to a multiple of them), or with one CPU device (a plain session or
    notebook) over one thread per core, as the metric kernels do; `threads` forces that
    many."""
    b = attn_BxHxTxT.shape[0]
    mesh = None if threads else parallel.local_mesh(b)
    if threads is None:
        one_cpu = jax.default_backend() == "cpu" and len(jax.local_devices()) == 1
        threads = min(os.cpu_count() or 1, b) if one_cpu else 1
    parts = mesh.size if mesh is not None else threads
    pad = -b % parts
    if pad:
        attn_BxHxTxT = jnp.concatenate([attn_BxHxTxT, jnp.repeat(attn_BxHxTxT[:1], pad, 0)])
        per_sequence = jnp.concatenate([per_sequence, jnp.repeat(per_sequence[:1], pad, 0)])
    if mesh is not None or parts == 1:
        return run(attn_BxHxTxT, per_sequence, mesh=mesh)[:b]
    size = (b + pad) // parts
    a, p = np.asarray(attn_BxHxTxT), np.asarray(per_sequence)  # views, not copies

    def part(i):
        cut = slice(i * size, (i + 1) * size)
        return jax.block_until_ready(run(a[cut], p[cut], mesh=None))

    with concurrent.futures.ThreadPoolExecutor(parts) as pool:
        return jnp.concatenate(list(pool.map(part, range(parts))))[:b]


@functools.partial(jax.jit, static_argnames=("objective", "horizon", "walk", "block", "mesh"))
def _measure(attn, rows, *, objective, horizon, walk, block, mesh):
    h = attn.shape[1]
    by_sequence = jax.default_backend() == "cpu"

    def local(attn, rows):
        def one_sequence(args):
            a, r = args

            def one_block(r_block):
                mixed = jnp.einsum("kh,hij->kij", r_block, a, precision=_HIGHEST)
                return _objective(mixed, objective, horizon, walk, a)

            return lax.map(one_block, r.reshape(-1, block, h)).reshape(-1)

        return lax.map(one_sequence, (attn, rows), batch_size=None if by_sequence else len(attn))

    if mesh is None:
        return local(attn, rows)
    spec = P(parallel.DATA)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)(
        attn, rows
    )


def measure_coalitions(
    attn_BxHxTxT, weights_BxH, first: int, count: int, low_bits: int, **kw
) -> jax.Array:
    """(B, count 2^low_bits): the objective of coalitions first 2^low_bits ... (first +
    count) 2^low_bits - 1 (bitmask indices), `weights_BxH` renormalised over each.

    Every coalition is a high part (bits low_bits and up) and a low part, and its
    unnormalised mix the sum of theirs: per sequence the 2^low_bits low mixes are formed
    once, and a block (one high part, every low part) costs one high mix and one add per
    entry and coalition rather than H multiply-adds. Coalitions of weight 0 (the empty
    one) are measured as the heads' mean: the caller sets their value. `kw`: objective,
    horizon, walk."""
    first = jnp.asarray(first, jnp.int32)
    run = functools.partial(_by_parts, first=first, count=count, low_bits=low_bits, **kw)
    return over_sequences(run, attn_BxHxTxT, weights_BxH)


@functools.partial(
    jax.jit, static_argnames=("count", "low_bits", "mesh", "objective", "horizon", "walk")
)
def _by_parts(attn, weights, *, first, count, low_bits, mesh, objective, horizon, walk):
    h = attn.shape[1]
    bits = jnp.arange(h)
    low_masks = (jnp.arange(2**low_bits)[:, None] >> bits[:low_bits]) & 1
    high_masks = ((first + jnp.arange(count))[:, None] >> (bits[low_bits:] - low_bits)) & 1
    by_sequence = jax.default_backend() == "cpu"

    def local(attn, weights):
        def one_sequence(args):
            a, w = args
            w_low = low_masks.astype(a.dtype) * w[:low_bits]
            u_low = jnp.einsum("kh,hij->kij", w_low, a[:low_bits], precision=_HIGHEST)
            # Weightless coalitions measure the heads' mean instead: a mix of 0 would never
            # let the fidelity's early stop fire for its block.
            fallback = jnp.mean(a, axis=0)

            def one_block(high):
                w_high = high.astype(a.dtype) * w[low_bits:]
                u_high = jnp.einsum("h,hij->ij", w_high, a[low_bits:], precision=_HIGHEST)
                total = jnp.sum(w_low, -1) + jnp.sum(w_high)
                scale = 1 / jnp.where(total > 0, total, 1)
                mixed = (u_low + u_high) * scale[:, None, None]
                mixed = jnp.where((total > 0)[:, None, None], mixed, fallback)
                return _objective(mixed, objective, horizon, walk, a)

            return lax.map(one_block, high_masks).reshape(-1)

        return lax.map(one_sequence, (attn, weights), batch_size=None if by_sequence else len(attn))

    if mesh is None:
        return local(attn, weights)
    spec = P(parallel.DATA)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)(
        attn, weights
    )


def _objective(mixed_KxTxT, objective: str, horizon: int, walk: str, heads_HxTxT=None):
    if objective == "fidelity":
        return settled_minimax(mixed_KxTxT, horizon, heads_HxTxT)
    return settled_hitting(mixed_KxTxT, horizon, walk)


def settled_minimax(c_KxTxT, horizon: int, heads_HxTxT=None) -> jax.Array:
    """min_j max_{1<=t<=horizon} s_t[j] of causal or general row-stochastic operators, the
    loop ended once the minimum is settled. A causal row sends a token's share only to
    itself and earlier tokens, so the share at or after the token with the lowest running
    maximum bounds every later value of it; for other operators the bound never holds
    and the loop runs all `horizon` steps. `heads_HxTxT`: the heads the operators mix,
    when they are mixes of them: their causality and largest row sum hold for every mix,
    and are read from H matrices rather than from every mix."""
    k, t = c_KxTxT.shape[0], c_KxTxT.shape[-1]
    tokens = jnp.arange(t)
    c = c_KxTxT if heads_HxTxT is None else heads_HxTxT
    causal = jnp.all(jnp.triu(c, 1) == 0)
    growth = jnp.maximum(jnp.max(jnp.sum(c, axis=-1)), 1)

    def settled(step, s, best):
        j = jnp.argmin(best, axis=-1)
        tail = jnp.sum(jnp.where(tokens >= j[:, None], s, 0), axis=-1)
        bound = tail * growth ** (horizon - step) * (1 + SETTLE_MARGIN)
        return causal & jnp.all(bound < jnp.min(best, axis=-1))

    def cond(carry):
        step, s, best = carry
        return (step < horizon) & ~settled(step, s, best)

    def body(carry):
        step, s, best = carry
        s = jnp.einsum("ki,kij->kj", s, c_KxTxT, precision=_HIGHEST)
        return step + 1, s, jnp.maximum(best, s)

    sink = jnp.broadcast_to(jax.nn.one_hot(t - 1, t, dtype=c_KxTxT.dtype), (k, t))
    _, _, best = lax.while_loop(cond, body, (0, sink, jnp.zeros_like(sink)))
    return jnp.min(best, axis=-1)


def settled_hitting(c_KxTxT, max_steps: int, walk: str) -> jax.Array:
    """(1/T) sum_i sum_{t<max_steps} S_t[i] on `walk`, as the metric kernels sum it: the
    survival row advanced step by step, the loop ended once the mass left would round
    away in every sum.

    A token the walk never leaves and no other token steps to (token 0 of causal
    attention on the reference walk) survives every step and changes no one else's
    survival: it is counted as max_steps steps at once and left out of the loop, whose
    mass can then fall below rounding and end it early."""
    k, t = c_KxTxT.shape[0], c_KxTxT.shape[-1]
    off_sink = jnp.broadcast_to(1 - jax.nn.one_hot(t - 1, t, dtype=c_KxTxT.dtype), (k, t))
    if walk == "reference":
        mat, scale = operators.walk_columns(c_KxTxT, "reference"), off_sink
    else:
        mat, scale = c_KxTxT, operators.normalized_scale(c_KxTxT) * off_sink
    step_to = mat * scale[:, None, :]  # step_to[j, i] = P[i, j]: row i, the steps into i
    stays = jnp.diagonal(step_to, axis1=-2, axis2=-1)
    stuck = (stays == 1) & (jnp.sum(step_to, -1) == stays) & (off_sink > 0)
    scale = jnp.where(stuck, 0, scale)
    stuck_count = jnp.sum(stuck, -1).astype(c_KxTxT.dtype)
    growth = jnp.maximum(jnp.max(jnp.sum(mat * scale[:, None], axis=-1)), 1)

    def done(step, mass, hit):
        full = hit + stuck_count * (step + 1)
        left = mass * growth ** (max_steps - 1 - step) * (1 + SETTLE_MARGIN)
        return (step >= max_steps - 1) | jnp.all(left < (jnp.nextafter(full, jnp.inf) - full) / 2)

    def body(carry):
        step, v, hit, _ = carry
        v = jnp.einsum("ki,kij->kj", v, mat, precision=_HIGHEST) * scale
        mass = jnp.sum(v, -1)
        return step + 1, v, hit + mass, done(step + 1, mass, hit + mass)

    v0 = jnp.where(stuck, 0, off_sink)
    hit0 = jnp.sum(v0, -1)  # S_0 summed over the starts off the sink that move
    hit = lax.while_loop(lambda carry: ~carry[3], body, (0, v0, hit0, done(0, hit0, hit0)))[2]
    return (hit + stuck_count * max_steps) / t


def padded_rows(rows_BxKxH: np.ndarray, size: int) -> np.ndarray:
    """Mixing rows padded (with copies of the first coalition) to `size` coalitions."""
    short = size - rows_BxKxH.shape[1]
    if short <= 0:
        return rows_BxKxH
    return np.concatenate([rows_BxKxH, np.repeat(rows_BxKxH[:, :1], short, axis=1)], axis=1)
