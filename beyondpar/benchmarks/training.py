"""Speed of a data-parallel training step of the paper's model, per head count, against
the step's FLOPs at the machine's own matmul rate."""

from __future__ import annotations

import json

import jax
import numpy as np
import optax

from beyondpar import model as model_lib
from beyondpar import tasks
from beyondpar.base import parallel
from beyondpar.base.timing import best_time
from beyondpar.benchmarks.machine import matmul_flops_per_s
from beyondpar.study import train


def train_step_flops(cfg, batch: int, t: int) -> float:
    """Matmul FLOPs of one forward + backward step (backward = 2x forward)."""
    d, f, v, layers = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
    per_layer = 2 * batch * t * (4 * d * d + 2 * d * f) + 2 * 2 * batch * t * t * d
    return 3 * (layers * per_layer + 2 * batch * t * d * v)


def train_suite(repeats: int = 5, heads=(1, 4, 8, 16), batch: int = 50, t: int = 100):
    """Milliseconds per data-parallel train step at the paper's size, per head count."""
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
