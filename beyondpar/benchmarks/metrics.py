"""Speed of the metric kernels as ratios taken in one run: against the paper's method,
against a NumPy loop of the same algorithm, against this machine's own matmul rate, and
against the bound its cache bandwidth puts on any vector recursion.

Each metric is a chain of vector-matrix products: every step reads every entry of the
operator's matrix for 2 flops per row advanced. The fused kernel advances the sink signal
on `c` and the reference walk on its own matrix, so it reads 2 T^2 floats per step for
4 T^2 flops (0.5 flop per byte). A matmul reuses each entry T times; a recursion cannot
(step t needs step t - 1), so at best it runs at the speed the matrices stream from
cache: `bandwidth_bound_*` below, measured in the same run. `product_bound_*` is the
reference for any kernel built on XLA's batched vector-matrix product: a bare recursion,
one product per matrix per step and nothing else, timed on the same operators in the
same blocks (a kernel built otherwise could beat it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondpar import graphs, metrics
from beyondpar.base import parallel
from beyondpar.base.timing import best_time
from beyondpar.benchmarks.baselines import numpy_exact, paper_method
from beyondpar.benchmarks.machine import (
    cache_bytes_per_s,
    in_cache_yardsticks_apply,
    matmul_flops_per_s,
)
from beyondpar.benchmarks.printing import print_result

T = K = 100  # the paper's sequence length and horizon
MATRICES_READ = {"fused": 2, "fused_normalized_walk": 1}  # per step: c (+ the walk's own)


def recursion_bytes(t: int, steps: int, matrices_per_step: int) -> int:
    """float32 bytes a recursion reads per operator: every matrix entry, every step."""
    return 4 * t * t * steps * matrices_per_step


def bandwidth_bound(flop: float, nbytes: float, bytes_per_s: float, flops_per_s: float) -> dict:
    """The fastest a recursion reading `nbytes` can do `flop` at `bytes_per_s`, as seconds
    and as a fraction of the matmul rate."""
    seconds = nbytes / bytes_per_s
    return {"seconds": seconds, "fraction_of_matmul": flop / seconds / flops_per_s}


def product_bound(flop: float, product_s: float, matrices_per_step: int, flops_per_s: float):
    """The fastest a kernel of `flop` reading `matrices_per_step` matrices per step can be
    when each read costs one bare product recursion (`product_s`), as seconds and as a
    fraction of the matmul rate."""
    seconds = matrices_per_step * product_s
    return {"seconds": seconds, "fraction_of_matmul": flop / seconds / flops_per_s}


def product_recursion(c, steps: int = K) -> jax.Array:
    """v c^steps from v = 1 for each operator of a block (b x T x T, as b x 1 x T): the
    bare recursion, one vector-matrix product per matrix per step and nothing else."""
    v = jnp.ones((c.shape[0], 1, c.shape[-1]), c.dtype)
    step = lambda _, v: jnp.einsum("bri,bij->brj", v, c, precision=lax.Precision.HIGHEST)
    return lax.fori_loop(0, steps, step, v)


def product_recursion_s(batch: jax.Array, repeats: int) -> float:
    """Best seconds of `product_recursion` over the operators `batch` (N x T x T, as the
    kernels get it), in the metric kernels' cache blocks over the local devices."""
    run = jax.jit(lambda c: metrics.map_blocks(product_recursion, c))
    return best_time(lambda: run(batch), repeats)


def metrics_suite(
    repeats: int = 5,
    sequences: int = 50,
    layers: int = 4,
    operators: int = 17,
    plain_session: bool = True,
):
    """Fidelity + hitting time on a batch shaped like the paper's 16-head evaluation.

    The headline kernel time takes the batch split over the local devices, as
    `evaluate` hands it over; `fused_from_one_device` includes splitting it first;
    `fidelity_plain_session` is the fidelity kernel in a fresh Python process with JAX's
    default single CPU device (a notebook), measured in the same run.
    """
    host = graphs.random_causal(0, (sequences, layers, operators), T)
    n = host.size // (T * T)
    batch = parallel.split_over_devices(host)
    timings = _kernel_times(host, batch, repeats)
    product_s = product_recursion_s(batch, repeats)
    paper_s, numpy_s = _baseline_times(host, repeats)
    rate = matmul_flops_per_s(repeats)
    cache = cache_bytes_per_s(repeats) if in_cache_yardsticks_apply() else None
    us = {name: 1e6 * v / n for name, v in timings.items()}
    us["product_recursion"] = 1e6 * product_s / n
    us.update(paper_method=1e6 * paper_s, numpy_exact=1e6 * numpy_s)
    result = {
        "matrices": n,
        "devices": len(jax.local_devices()),
        "matmul_gflops": rate / 1e9,
        "us_per_matrix": us,
        "speedup_vs_paper": paper_s / (timings["fused"] / n),
        "speedup_vs_numpy_exact": numpy_s / (timings["fused"] / n),
        "cache_gb_per_s": None if cache is None else cache / 1e9,
        **_rates_and_bounds(timings, product_s, n, rate, cache),
    }
    if plain_session:
        plain = plain_session_fidelity_us(sequences, layers, operators)
        us["fidelity_plain_session"] = plain
        result["plain_session_vs_launcher"] = plain / us["fidelity"]
    print_result(_lines(result), result)
    return result


def _rates_and_bounds(
    timings: dict, product_s: float, n: int, rate: float, cache: float | None
) -> dict:
    """The kernels' flop rates over `n` operators against the matmul `rate`, and their
    shares of the XLA-product bound and, where `cache` (bytes/s) is given, of the
    cache-bandwidth bound."""
    flop = 2 * 2 * K * T * T * n  # two metrics, 2 K T^2 each
    products = {
        name: product_bound(flop, product_s, reads, rate) for name, reads in MATRICES_READ.items()
    }
    result = {
        "effective_gflops": flop / timings["fused"] / 1e9,
        "fraction_of_matmul": flop / timings["fused"] / rate,
        "fraction_of_matmul_normalized_walk": flop / timings["fused_normalized_walk"] / rate,
        "product_bound_fraction_of_matmul": {
            name: b["fraction_of_matmul"] for name, b in products.items()
        },
        "fraction_of_product_bound": {
            name: b["seconds"] / timings[name] for name, b in products.items()
        },
    }
    if cache is not None:
        bounds = {
            name: bandwidth_bound(flop, n * recursion_bytes(T, K, reads), cache, rate)
            for name, reads in MATRICES_READ.items()
        }
        result["bandwidth_bound_fraction_of_matmul"] = {
            name: b["fraction_of_matmul"] for name, b in bounds.items()
        }
        result["fraction_of_bandwidth_bound"] = {
            name: b["seconds"] / timings[name] for name, b in bounds.items()
        }
    return result


def _kernel_times(host: np.ndarray, batch: jax.Array, repeats: int) -> dict:
    """Best seconds of each kernel on `batch` (`host` split over the local devices) and,
    for `fused_from_one_device`, on `host` on one device."""
    one_device = jnp.asarray(host)

    def fused(c, walk="reference"):
        return lambda: metrics.operator_metrics(c, horizon=K, max_steps=K, walk=walk)

    return {
        "fused": best_time(fused(batch), repeats),
        "fused_from_one_device": best_time(fused(one_device), repeats),
        "fused_normalized_walk": best_time(fused(batch, "normalized"), repeats),
        "fidelity": best_time(lambda: metrics.minimax_fidelity(batch, K), repeats),
        "hitting_time": best_time(lambda: metrics.hitting_time(batch, K), repeats),
    }


def _baseline_times(host: np.ndarray, repeats: int) -> tuple[float, float]:
    """Seconds per matrix of the paper's method (one matrix) and of the NumPy loop."""
    sample = np.asarray(host.reshape(-1, T, T)[:8], np.float64)
    sample /= sample.sum(-1, keepdims=True)
    start = time.perf_counter()
    paper_method(sample[0], np.random.default_rng(0))
    paper_s = time.perf_counter() - start
    numpy_s = min(_time_loop(numpy_exact, sample) for _ in range(repeats)) / len(sample)
    return paper_s, numpy_s


def _time_loop(fn, mats) -> float:
    start = time.perf_counter()
    for m in mats:
        fn(m)
    return time.perf_counter() - start


def _lines(r: dict):
    """The summary lines of a result, before its JSON line."""
    us = r["us_per_matrix"]
    yield f"{r['matrices']} operators, T=100, K=100, {r['devices']} device(s)"
    yield f"matmul rate            {r['matmul_gflops']:10.1f} GFLOP/s"
    for name, value in us.items():
        yield f"{name:<22} {value:10.1f} us/matrix"
    yield f"speed-up vs paper      {r['speedup_vs_paper']:10.0f}x"
    yield f"speed-up vs NumPy loop {r['speedup_vs_numpy_exact']:10.1f}x"
    yield f"effective rate         {r['effective_gflops']:10.1f} GFLOP/s"
    yield f"fraction of matmul     {r['fraction_of_matmul']:10.1%}"
    yield f"  (normalised walk)    {r['fraction_of_matmul_normalized_walk']:10.1%}"
    if r["cache_gb_per_s"] is None:
        yield "cache bandwidth        no bound off the CPU (machine.in_cache_yardsticks_apply)"
    else:
        yield f"cache bandwidth        {r['cache_gb_per_s']:10.1f} GB/s (read + write, in cache)"
        bound, share = r["bandwidth_bound_fraction_of_matmul"], r["fraction_of_bandwidth_bound"]
        for name in MATRICES_READ:
            yield (
                f"  {name}: bandwidth bound {bound[name]:6.1%} of matmul; "
                f"kernel at {share[name]:6.1%} of that bound"
            )
    bound, share = r["product_bound_fraction_of_matmul"], r["fraction_of_product_bound"]
    for name in MATRICES_READ:
        yield (
            f"  {name}: XLA product bound {bound[name]:6.1%} of matmul; "
            f"kernel at {share[name]:6.1%} of that bound"
        )
    if "plain_session_vs_launcher" in r:
        yield f"plain session / launcher (fidelity) {r['plain_session_vs_launcher']:6.2f}x"


def plain_session_fidelity_us(sequences: int = 50, layers: int = 4, operators: int = 17) -> float:
    """us/matrix of `minimax_fidelity` in a fresh Python process that never asked for one
    CPU device per core, i.e. a plain script or notebook."""
    command = [sys.executable, "-m", "beyondpar.benchmarks.plain_session"]
    command += [str(sequences), str(layers), str(operators)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["us"]
