"""One load of a GGUF file, as the load suite times it in a fresh process (what a user
pays, compilation included, and its own peak memory):

python -m beyondpar.benchmarks.single_load FILE.gguf new|previous

`new` is `pretrained.load`, `previous` the reference reader (`reference_gguf`); prints
one JSON object: seconds, peak and before-load memory (GB), the weights' size and the
sum of every parameter (to tell that both paths read the same values)."""

from __future__ import annotations

import json
import resource
import sys
import time

import jax
import numpy as np

from beyondpar import pretrained
from beyondpar.base import parallel
from beyondpar.benchmarks import reference_gguf

LOADERS = {
    "new": lambda path: pretrained.load(path, progress=False),
    "previous": reference_gguf.load,
}


def peak_rss_gb() -> float:
    """Peak GB of this process: VmHWM (ru_maxrss keeps the parent's across exec)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 2**20
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(path: str, which: str) -> dict:
    """Seconds, memory and per-parameter sums of one load of `path` by `which` path."""
    jax.numpy.zeros(1).block_until_ready()  # the backend started before the clock
    before = peak_rss_gb()
    start = time.perf_counter()
    _, params, _ = LOADERS[which](path)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    peak = peak_rss_gb()
    leaves = jax.tree_util.tree_leaves_with_path(params)
    sums = {jax.tree_util.keystr(p): float(np.asarray(x, np.float64).sum()) for p, x in leaves}
    return {
        "seconds": seconds,
        "peak_rss_gb": peak,
        "rss_before_load_gb": before,
        "weights_gb": sum(x.nbytes for _, x in leaves) / 2**30,
        "checksum": sums,
    }


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    print(json.dumps(measure(*sys.argv[1:3])))
