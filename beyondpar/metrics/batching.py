"""Block execution: a batch of operators in cache blocks, over local devices and threads.

Streaming every matrix from memory once per step leaves a CPU idle on memory bandwidth,
so on CPU the batch is cut into blocks of a few matrices that stay in cache for the whole
horizon, and the blocks are spread over all local devices; a plain session with one CPU
device runs a part of the batch per thread instead.
"""

from __future__ import annotations

import concurrent.futures
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from beyondpar.base import checks, parallel

# Matrices per cache block on CPU: 10 float32 100x100 operators (400 KB) fit in L2; larger
# matrices get fewer per block (one 1024 x 1024 operator, 4 MB, still sits in L3).
CPU_BLOCK = 10
CPU_BLOCK_BYTES = 512 * 1024


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


def threaded(fn, c):
    """fn(c) for a jitted kernel over operators `c`, run by `in_threads` and joined."""
    outs = in_threads(fn, c)
    if len(outs) == 1:
        return outs[0]
    n = math.prod(c.shape[:-2])  # the last part's padding dropped
    joined = jax.tree.map(lambda *xs: jnp.concatenate(xs)[:n], *outs)
    return jax.tree.map(lambda x: x.reshape(*c.shape[:-2], *x.shape[1:]), joined)


def in_threads(fn, c) -> list:
    """[fn(c)], or fn of one part of the flattened batch per thread, the parts of equal
    size (the last padded, see `threaded`).

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
