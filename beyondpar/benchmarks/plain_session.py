"""The fidelity kernel in a plain Python process, one that never asked for one CPU device
per core (a script or a notebook), as the metrics suite compares it with the launcher:

python -m beyondpar.benchmarks.plain_session SEQUENCES LAYERS OPERATORS

prints one JSON object: microseconds per matrix and the devices JAX saw."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp

from beyondpar import graphs, metrics
from beyondpar.base.timing import best_time


def fidelity_us(sequences: int, layers: int, operators: int) -> dict:
    """Best us/matrix of `minimax_fidelity` (T = K = 100) over 5 repeats."""
    c = jnp.asarray(graphs.random_causal(0, (sequences, layers, operators), 100))
    seconds = best_time(lambda: metrics.minimax_fidelity(c, 100), 5)
    return {"us": 1e6 * seconds / c[..., 0, 0].size, "devices": jax.device_count()}


if __name__ == "__main__":
    print(json.dumps(fidelity_us(*map(int, sys.argv[1:4]))))
