"""The machine's own yardsticks, measured in the same run as what is compared with them."""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondpar.base import parallel
from beyondpar.base.timing import best_time


def matmul_flops_per_s(repeats: int, size: int = 2048) -> float:
    """float32 matmul rate of the default device."""
    x = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    matmul = jax.jit(lambda a: a @ a)
    return 2 * size**3 / best_time(lambda: matmul(x), repeats)


def copy_bytes_per_s(repeats: int, megabytes: int = 256) -> float:
    """Bytes read plus written per second by an elementwise pass over a large float32
    array split over the local devices (every core streaming its share), in place: a
    fresh output would time the kernel mapping new pages, not the memory."""
    n = megabytes * 2**20 // 4
    devices = len(jax.local_devices())
    holder = [parallel.split_over_devices(np.ones((devices, n // devices), np.float32))]
    shift = jax.jit(lambda a: a + 1.0, donate_argnums=0)

    def run():
        holder[0] = shift(holder[0])
        return holder[0]

    return 2 * holder[0].nbytes / best_time(run, repeats)


def cache_bytes_per_s(repeats: int, kilobytes: int = 800, passes: int = 256) -> float:
    """Bytes read plus written per second by `passes` elementwise passes over a block of
    `kilobytes` per local device, inside one call: the block stays in each core's cache,
    so this is the rate at which a core streams a cache-resident working set (the metric
    kernels' cache block of two 100 x 100 operators per matrix is 800 KB)."""
    seconds, block = _in_cache_passes(repeats, kilobytes, passes, lambda x: x * 0.5 + 0.5)
    return 2 * passes * block.nbytes / seconds


def in_cache_yardsticks_apply() -> bool:
    """Whether `cache_bytes_per_s` and `exp_per_s` bound anything on this backend. They
    time passes inside one call over a cache-resident block, which is how a CPU core runs
    the metric recursions and the softmax. On a GPU each pass of their loop is a kernel
    launch (an H200 gave 7.8 G exp/s and 161 GB/s, launch rates, not the chip's), and the
    softmax's exponentials are fused into passes the copy bandwidth already counts."""
    return jax.default_backend() == "cpu"


def exp_per_s(repeats: int, kilobytes: int = 256, passes: int = 64) -> float:
    """Exponentials per second over all local devices: `passes` passes of x -> exp(-x)
    over a cache-resident float32 block of `kilobytes` per device, inside one call. The
    softmax's exponentials run at this rate, not at the copy bandwidth (the values stay
    in [exp(-1), 1], so no pass takes a slow path for infinities or subnormals)."""
    seconds, block = _in_cache_passes(repeats, kilobytes, passes, lambda x: jnp.exp(-x))
    return passes * block.size / seconds


def _in_cache_passes(repeats: int, kilobytes: int, passes: int, step):
    """(best seconds of one call applying `step` `passes` times to a float32 block of
    ones, `kilobytes` per local device; that block)."""
    devices = len(jax.local_devices())
    block = parallel.split_over_devices(np.ones((devices, kilobytes * 256), np.float32))
    run = jax.jit(lambda a: lax.fori_loop(0, passes, lambda _, x: step(x), a))
    return best_time(lambda: run(block), repeats), block


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (GB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
