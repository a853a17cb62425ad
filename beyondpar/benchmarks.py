"""Speed measurements as ratios taken in one run: against the paper's method, against a
NumPy loop of the same algorithm, and against this machine's own matmul rate."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import metrics


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of `repeats` calls after one warm-up (compile) call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_flops_per_s(repeats: int, size: int = 2048) -> float:
    """float32 matmul rate of the default device: the machine's own yardstick."""
    x = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
    matmul = jax.jit(lambda a: a @ a)
    return 2 * size**3 / best_time(lambda: matmul(x), repeats)


def random_causal_attention(
    seed: int, shape: tuple[int, ...], t: int, scale: float = 2.0, dtype=np.float32
):
    """Softmax of Gaussian scores under a causal mask: rows sum to 1, zeros above diagonal."""
    rng = np.random.default_rng(seed)
    scores = scale * rng.standard_normal((*shape, t, t))
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = probs.astype(dtype)
    return probs / probs.sum(-1, keepdims=True)


# ---------------------------------------------------------------- NumPy baselines


def numpy_walk_columns(c: np.ndarray) -> np.ndarray:
    """The reference walk in column form, as in `metrics`, for one matrix."""
    cum = np.minimum(1.0, np.cumsum(c, axis=0))
    w = np.diff(cum, axis=0, prepend=0.0)
    w[-1] += 1.0 - cum[-1]
    return w


def paper_method(c: np.ndarray, rng: np.random.Generator, walks: int = 500, k: int = 100):
    """The paper's pipeline for one operator: fidelity from matrix powers, hitting time by
    `walks` Monte Carlo walks per start token drawn from the unnormalised columns."""
    t = c.shape[0]
    power = np.eye(t)
    best = np.zeros(t)
    for _ in range(k):
        power = power @ c
        best = np.maximum(best, power[-1])
    walk_rows = numpy_walk_columns(c).T
    cdf = np.cumsum(walk_rows, axis=1)
    total = 0
    for start in range(t - 1):
        for _ in range(walks):
            state, steps = start, 0
            while state != t - 1 and steps < k:
                state = min(int(np.searchsorted(cdf[state], rng.random(), side="right")), t - 1)
                steps += 1
            total += steps
    return best.min(), total / (walks * t)


def numpy_exact(c: np.ndarray, k: int = 100):
    """The exact algorithm of `metrics`, one matrix at a time in NumPy."""
    t = c.shape[0]
    s = np.zeros(t, c.dtype)
    s[-1] = 1
    survival = np.ones(t, c.dtype)
    survival[-1] = 0
    w = numpy_walk_columns(c)
    best = np.zeros(t, c.dtype)
    hit = survival.sum()
    for step in range(1, k + 1):
        s = s @ c
        best = np.maximum(best, s)
        survival = survival @ w
        survival[-1] = 0
        if step < k:
            hit += survival.sum()
    return best.min(), hit / t


# ---------------------------------------------------------------- suites


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
    from beyondpar import parallel

    t = k = 100
    host = random_causal_attention(0, (sequences, layers, operators), t)
    one_device = jnp.asarray(host)
    mesh = parallel.data_mesh(jax.local_devices())
    split = sequences % mesh.size == 0
    batch = jax.device_put(host, parallel.batch_sharded(mesh)) if split else one_device
    n = host.size // (t * t)
    rate = matmul_flops_per_s(repeats)

    def fused(c, walk="reference"):
        return lambda: metrics.operator_metrics(c, horizon=k, max_steps=k, walk=walk)

    kernel_s = best_time(fused(batch), repeats)
    timings = {
        "fused": kernel_s,
        "fused_from_one_device": best_time(fused(one_device), repeats),
        "fused_normalized_walk": best_time(fused(batch, "normalized"), repeats),
        "fidelity": best_time(lambda: metrics.minimax_fidelity(batch, k), repeats),
        "hitting_time": best_time(lambda: metrics.hitting_time(batch, k), repeats),
    }
    sample = np.asarray(host.reshape(-1, t, t)[:8], np.float64)
    sample /= sample.sum(-1, keepdims=True)
    start = time.perf_counter()
    paper_method(sample[0], np.random.default_rng(0))
    paper_s = time.perf_counter() - start
    numpy_s = min(_time_loop(numpy_exact, sample) for _ in range(repeats)) / len(sample)
    flop = 2 * 2 * k * t * t * n  # two metrics, 2 K T^2 each
    us = {name: 1e6 * v / n for name, v in timings.items()}
    us.update(paper_method=1e6 * paper_s, numpy_exact=1e6 * numpy_s)
    result = {
        "matrices": n,
        "devices": mesh.size,
        "matmul_gflops": rate / 1e9,
        "us_per_matrix": us,
        "speedup_vs_paper": paper_s / (kernel_s / n),
        "speedup_vs_numpy_exact": numpy_s / (kernel_s / n),
        "effective_gflops": flop / kernel_s / 1e9,
        "fraction_of_matmul": flop / kernel_s / rate,
        "fraction_of_matmul_normalized_walk": flop / timings["fused_normalized_walk"] / rate,
    }
    if plain_session:
        from beyondpar import benchmarks_analysis

        plain = benchmarks_analysis.plain_session_fidelity_us(sequences, layers, operators)
        us["fidelity_plain_session"] = plain
        result["plain_session_vs_launcher"] = plain / us["fidelity"]
    _print_metrics(result)
    return result


def _time_loop(fn, mats) -> float:
    start = time.perf_counter()
    for m in mats:
        fn(m)
    return time.perf_counter() - start


def _print_metrics(r: dict) -> None:
    us = r["us_per_matrix"]
    print(f"{r['matrices']} operators, T=100, K=100, {r['devices']} device(s)")
    print(f"matmul rate            {r['matmul_gflops']:10.1f} GFLOP/s")
    for name, value in us.items():
        print(f"{name:<22} {value:10.1f} us/matrix")
    print(f"speed-up vs paper      {r['speedup_vs_paper']:10.0f}x")
    print(f"speed-up vs NumPy loop {r['speedup_vs_numpy_exact']:10.1f}x")
    print(f"effective rate         {r['effective_gflops']:10.1f} GFLOP/s")
    print(f"fraction of matmul     {r['fraction_of_matmul']:10.1%}")
    print(f"  (normalised walk)    {r['fraction_of_matmul_normalized_walk']:10.1%}")
    if "plain_session_vs_launcher" in r:
        print(f"plain session / launcher (fidelity) {r['plain_session_vs_launcher']:6.2f}x")
    print(json.dumps(r))


def train_step_flops(cfg, batch: int, t: int) -> float:
    """Matmul FLOPs of one forward + backward step (backward = 2x forward)."""
    d, f, v, layers = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
    per_layer = 2 * batch * t * (4 * d * d + 2 * d * f) + 2 * 2 * batch * t * t * d
    return 3 * (layers * per_layer + 2 * batch * t * d * v)


def train_suite(repeats: int = 5, heads=(1, 4, 8, 16), batch: int = 50, t: int = 100):
    """Milliseconds per data-parallel train step at the paper's size, per head count."""
    import optax

    from beyondpar import model as model_lib
    from beyondpar import parallel, tasks, train

    mesh = parallel.data_mesh()
    rate = matmul_flops_per_s(repeats)
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), batch, t, 256)
    sharded = tasks.Examples(*(parallel.shard_batch(np.asarray(a), mesh) for a in examples))
    ms, flops = {}, None
    for h in heads:
        cfg = model_lib.ModelConfig(num_heads=h, max_len=t)
        module, tx = model_lib.Transformer(cfg), optax.adam(1e-3)
        state = train.create_state(module, jax.random.PRNGKey(0), tx, t)
        holder = [jax.device_put(state, parallel.replicated(mesh))]
        step = train.make_train_step(module, tx, mesh, jax.random.PRNGKey(2))

        def run(holder=holder, step=step):
            holder[0], loss = step(holder[0], sharded)
            return loss

        ms[str(h)] = 1e3 * best_time(run, repeats)
        flops = train_step_flops(cfg, batch, t)
    floor_ms = 1e3 * flops / rate
    result = {
        "devices": mesh.size,
        "matmul_gflops": rate / 1e9,
        "step_gflop": flops / 1e9,
        "floor_ms": floor_ms,
        "ms_per_step": ms,
        "tokens_per_s": {h: batch * t / (v / 1e3) for h, v in ms.items()},
        "x_floor": {h: v / floor_ms for h, v in ms.items()},
        "ratio_16_to_1": ms["16"] / ms["1"] if {"1", "16"} <= ms.keys() else None,
    }
    print(f"batch {batch}, T={t}, d=64, 4 layers, {mesh.size} device(s)")
    print(f"step {flops / 1e9:.2f} GFLOP; matmul {rate / 1e9:.0f} GFLOP/s; floor {floor_ms:.1f} ms")
    for h, v in ms.items():
        print(
            f"H={h:>2}: {v:7.1f} ms/step {result['tokens_per_s'][h]:9.0f} tokens/s "
            f"{result['x_floor'][h]:5.2f}x floor"
        )
    if result["ratio_16_to_1"]:
        print(f"step(H=16) / step(H=1) = {result['ratio_16_to_1']:.2f}")
    print(json.dumps(result))
    return result


def _analysis_suite(module: str, name: str) -> Callable[..., dict]:
    """A suite whose module is imported when it runs (the analyses load the pretrained
    families)."""

    def run(**kwargs):
        import importlib

        return getattr(importlib.import_module(f"beyondpar.{module}"), name)(**kwargs)

    return run


SUITES: dict[str, Callable[..., dict]] = {
    "metrics": metrics_suite,
    "train": train_suite,
    "synergy": _analysis_suite("benchmarks_analysis", "synergy_suite"),
    "pretrained": _analysis_suite("benchmarks_analysis", "pretrained_suite"),
    "corpus": _analysis_suite("benchmarks_corpus", "corpus_suite"),
}
