"""Speed of language-model training at the cpu size of `configs/lm.py` (d_model 64, 4
layers, T 128, batch 32, bytes), per head count: tokens per second and the step's time
against this machine's roofline floor (`train.roofline_ms`, from its own matmul rate,
copy bandwidth and exponential rate, the best of measurements taken before and after
each head count's steps) and against an independent PyTorch step of the same
model on the same windows (when torch is installed), all measured in the same run; then
the loader's tokens per second on one core against the step's.

Goals, printed beside the ratios: the JAX step at least 2x faster than PyTorch's at every
head count, within 2x of the floor (on the CPU the floor that also pays for the softmax's
exponentials: the one a step could reach), and the loader at least 10x the fastest
step's tokens per second. The PyTorch step is `torch_baseline`'s (Adam, no clipping or
weight decay: the same matrix work as AdamW with a clip, a few passes over the
parameters less).
"""

from __future__ import annotations

import jax
import numpy as np

from beyondpar import model as model_lib
from beyondpar.base import parallel
from beyondpar.benchmarks import torch_baseline
from beyondpar.benchmarks import train as train_bench
from beyondpar.benchmarks.machine import (
    copy_bytes_per_s,
    exp_per_s,
    in_cache_yardsticks_apply,
    matmul_flops_per_s,
)
from beyondpar.benchmarks.printing import print_result
from beyondpar.lm import data as data_lib
from beyondpar.lm import speed
from beyondpar.study import config_lib, text_config, text_optim, text_step, train

# The cpu size of configs/lm.py (a test keeps them equal).
CPU_MODEL = dict(embed_dim=64, num_layers=4, mlp_dim=256, max_len=128, dropout_rate=0.0)
SEQ_LEN, BATCH = 128, 32
HEADS = text_config.SWEEP_HEADS
GOALS = {"x_torch": 2.0, "x_floor": 2.0, "loader_x": 10.0}


def model_config(heads: int) -> model_lib.ModelConfig:
    return model_lib.ModelConfig(num_heads=heads, **CPU_MODEL)


def ratios(row: dict, tokens_per_step: int, loader_tokens_per_s: float | None = None) -> dict:
    """A head count's ratios from its milliseconds (`jax`, `floor`, optional `torch`):
    tokens per second, PyTorch's time over JAX's (higher: JAX faster), JAX's over the
    floor (lower: nearer), and the loader's tokens per second over the step's."""
    tokens_per_s = tokens_per_step / (row["jax"] / 1e3)
    out = {"tokens_per_s": tokens_per_s, "x_floor": row["jax"] / row["floor"]}
    if "torch" in row:
        out["x_torch"] = row["torch"] / row["jax"]
    if loader_tokens_per_s is not None:
        out["loader_x"] = loader_tokens_per_s / tokens_per_s
    return out


def goals_met(found: dict) -> dict[str, bool]:
    """Each goal of `GOALS` the ratios hold: x_torch and loader_x at least theirs,
    x_floor at most its."""
    met = {}
    for name, goal in GOALS.items():
        if name in found:
            met[name] = found[name] <= goal if name == "x_floor" else found[name] >= goal
    return met


def row_line(heads: int, row: dict, found: dict) -> str:
    """One printed line: the step, tokens per second, and each ratio with its goal."""
    met = goals_met(found)

    def mark(name):
        return "ok" if met[name] else "MISSED"

    line = (
        f"H={heads:>2}: {row['jax']:7.1f} ms/step {found['tokens_per_s']:8.0f} tokens/s; "
        f"floor {row['floor']:6.1f} ms: {found['x_floor']:4.2f}x "
        f"(goal <= {GOALS['x_floor']:g}x: {mark('x_floor')})"
    )
    if "x_torch" in found:
        line += (
            f"; PyTorch {row['torch']:7.1f} ms: {found['x_torch']:4.2f}x slower "
            f"(goal >= {GOALS['x_torch']:g}x: {mark('x_torch')})"
        )
    return line


def loader_line(loader_tokens_per_s: float, step_tokens_per_s: float) -> str:
    found = {"loader_x": loader_tokens_per_s / step_tokens_per_s}
    met = "ok" if goals_met(found)["loader_x"] else "MISSED"
    return (
        f"loader on one core: {loader_tokens_per_s:,.0f} tokens/s, {found['loader_x']:.1f}x the "
        f"fastest step's {step_tokens_per_s:,.0f} (goal >= {GOALS['loader_x']:g}x: {met})"
    )


def jax_step(cfg: model_lib.ModelConfig, mesh, windows_BxT1: np.ndarray):
    """A call of one AdamW update of `text_step` on the windows, carrying its state on."""
    module = model_lib.Transformer(cfg)
    tx = text_optim.optimizer(text_optim.OptimSettings.from_config(_optim_config()))
    state = train.create_state(module, jax.random.PRNGKey(0), tx, SEQ_LEN)
    holder = [jax.device_put(state, parallel.replicated(mesh))]
    update = text_step.jitted_update(module, tx, mesh, 1, "float32", windows_BxT1.shape)
    batch = parallel.shard_batch(windows_BxT1, mesh)
    key = jax.random.PRNGKey(2)

    def run():
        holder[0], metrics = update(holder[0], batch, key)
        return metrics["loss"]

    return run


def _optim_config():
    return config_lib.base_text_config().optim


def machine_rates(repeats: int, best: tuple | None = None) -> tuple:
    """(matmul FLOP/s, copy bytes/s, exp/s or None off the CPU), each the best of this
    measurement and `best`: measured again after every head count, so that a loaded
    stretch of a shared machine lowers no floor below what the machine did at its best."""
    exps = exp_per_s(repeats) if in_cache_yardsticks_apply() else None
    now = (matmul_flops_per_s(repeats), copy_bytes_per_s(repeats), exps)
    if best is None:
        return now
    return tuple(None if a is None else max(a, b) for a, b in zip(now, best, strict=True))


def lm_suite(repeats: int = 5, heads=HEADS, loader_steps: int = 50) -> dict:
    """Milliseconds per step and tokens per second per head count, JAX and PyTorch timed
    in turns (`train.step_ms`), against the floor at the machine's best rates so far,
    then again, every head count, at the best rates of the whole run (the ratios kept);
    then the loader on one core."""
    mesh = parallel.data_mesh()
    rates = machine_rates(repeats)
    text_data = data_lib.load(data_lib.default_data_config(), seed=0)
    windows = np.asarray(text_data.train_batch(0, BATCH, SEQ_LEN, 0, 1))
    torch_device = "cpu" if torch_baseline.available() else None
    if torch_device is not None and jax.default_backend() == "gpu":
        torch_device = torch_baseline.device_for("gpu")
    print(
        f"cpu size of configs/lm.py: d_model {CPU_MODEL['embed_dim']}, 4 layers, T {SEQ_LEN}, "
        f"batch {BATCH}, {mesh.size} device(s); {rates_text(rates)}"
    )
    if torch_device is None:
        print("PyTorch baseline: skipped (torch is not importable; pip install torch)")
    rows, found = {}, {}
    for h in heads:
        cfg = model_config(h)
        steps = {"jax": jax_step(cfg, mesh, windows)}
        if torch_device is not None:
            steps["torch"] = torch_baseline.step_runner(
                cfg, windows[:, :-1], windows[:, 1:], mesh.size, torch_device
            )
        row = train_bench.step_ms(steps, repeats)
        rates = machine_rates(repeats, rates)
        row["floor"] = train_bench.roofline_ms(cfg, BATCH, SEQ_LEN, *rates)
        rows[h], found[h] = row, ratios(row, BATCH * SEQ_LEN)
        print(row_line(h, row, found[h]), flush=True)
    print(f"at the best rates of the run ({rates_text(rates)}), the final ratios:")
    for h, row in rows.items():
        row["floor"] = train_bench.roofline_ms(model_config(h), BATCH, SEQ_LEN, *rates)
        found[h] = ratios(row, BATCH * SEQ_LEN)
        print(row_line(h, row, found[h]))
    loader = speed.train_batch_tokens_per_second(text_data, BATCH, SEQ_LEN, loader_steps)
    fastest = max(f["tokens_per_s"] for f in found.values())
    print(loader_line(loader, fastest))
    result = _result(rows, found, loader, fastest, rates, mesh.size)
    print_result([], result)
    return result


def rates_text(rates: tuple) -> str:
    rate, bandwidth, exps = rates
    text = f"matmul {rate / 1e9:.0f} GFLOP/s, copy {bandwidth / 1e9:.1f} GB/s"
    return text + (f", exp {exps / 1e9:.2f} G/s" if exps is not None else "")


def _result(rows, found, loader, fastest, rates, devices) -> dict:
    rate, bandwidth, exps = rates
    return {
        "devices": devices,
        "matmul_gflops": rate / 1e9,
        "copy_gb_per_s": bandwidth / 1e9,
        "exp_g_per_s": None if exps is None else exps / 1e9,
        "ms_per_step": {str(h): r["jax"] for h, r in rows.items()},
        "floor_ms": {str(h): r["floor"] for h, r in rows.items()},
        "torch_ms_per_step": {str(h): r["torch"] for h, r in rows.items() if "torch" in r} or None,
        "ratios": {str(h): f for h, f in found.items()},
        "goals": GOALS,
        "goals_met": {str(h): goals_met(f) for h, f in found.items()},
        "loader_tokens_per_s": loader,
        "loader_x_fastest_step": loader / fastest,
        "loader_goal_met": loader / fastest >= GOALS["loader_x"],
    }
