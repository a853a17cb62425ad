"""The machine's own yardsticks, measured in the same run as what is compared with them."""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp

from beyondpar.base.timing import best_time


def matmul_flops_per_s(repeats: int, size: int = 2048) -> float:
    """float32 matmul rate of the default device."""
    x = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    matmul = jax.jit(lambda a: a @ a)
    return 2 * size**3 / best_time(lambda: matmul(x), repeats)


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (GB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
