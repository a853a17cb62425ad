"""Speed of a data-parallel training step of the paper's model, per head count, against an
independent PyTorch version of the same step (when torch is installed) and against a
roofline floor of this machine, all measured in the same run.

The floor of a step is its matmul FLOPs at the machine's matmul rate plus its passes over
the attention tensors (B x H x T x T per layer, the only part that grows with H) at the
machine's copy bandwidth. `ATTENTION_PASSES` counts the passes an implementation cannot
avoid without recomputing the attention: forward, the scores are written and read by the
softmax, the probabilities written and read by the value product; backward, the
probability gradient is written and read with the probabilities, the score gradient
written and read by the query and key products, and the probabilities read by the value
product (dropout masks are recomputed from their key, not stored).

On CPU the softmax's exponentials, one per attention element, cost more than a pass over
them, so a second floor adds them at the machine's exponential rate
(`machine.exp_per_s`): the first floor is what a memory-bound step could reach, the
second what one that also pays for its exponentials could.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from beyondpar import model as model_lib
from beyondpar import tasks
from beyondpar.base import parallel
from beyondpar.base.timing import best_time
from beyondpar.benchmarks import step_profile, torch_baseline
from beyondpar.benchmarks.machine import (
    copy_bytes_per_s,
    exp_per_s,
    in_cache_yardsticks_apply,
    matmul_flops_per_s,
)
from beyondpar.benchmarks.printing import print_result
from beyondpar.study import train as study_train

ATTENTION_PASSES = 11


def train_step_flops(cfg, batch: int, t: int) -> float:
    """Matmul FLOPs of one forward + backward step (backward = 2x forward)."""
    d, f, v, layers = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
    per_layer = 2 * batch * t * (4 * d * d + 2 * d * f) + 2 * 2 * batch * t * t * d
    return 3 * (layers * per_layer + 2 * batch * t * d * v)


def attention_elements(cfg, batch: int, t: int) -> int:
    """Elements of the step's attention tensors: B x H x T x T per layer."""
    return cfg.num_layers * batch * cfg.num_heads * t * t


def attention_bytes(cfg, batch: int, t: int) -> float:
    """Bytes the step moves over attention tensors: ATTENTION_PASSES float32 passes."""
    return ATTENTION_PASSES * attention_elements(cfg, batch, t) * 4


def roofline_ms(
    cfg,
    batch: int,
    t: int,
    flops_per_s: float,
    bytes_per_s: float,
    exps_per_s: float | None = None,
) -> float:
    """The step's floor: FLOPs at the matmul rate plus attention passes at the copy
    bandwidth, plus one exponential per attention element when `exps_per_s` is given."""
    seconds = train_step_flops(cfg, batch, t) / flops_per_s
    seconds += attention_bytes(cfg, batch, t) / bytes_per_s
    if exps_per_s is not None:
        seconds += attention_elements(cfg, batch, t) / exps_per_s
    return 1e3 * seconds


ROUNDS = 4


def step_ms(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best milliseconds of each of `steps` over `repeats` timed calls, taken in up to
    `ROUNDS` rounds that take turns: in each round every step gets a warm-up call and its
    share of the calls, in reverse order every other round. A slow stretch of a shared
    machine then falls on every step alike, not on whichever ran through it."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rounds = min(ROUNDS, repeats)
    best = dict.fromkeys(steps, float("inf"))
    for i in range(rounds):
        calls = repeats // rounds + (i < repeats % rounds)
        for name in list(steps)[:: 1 if i % 2 == 0 else -1]:
            best[name] = min(best[name], best_time(steps[name], calls))
    return {name: 1e3 * seconds for name, seconds in best.items()}


def training_steps(cfg, mesh, examples: tasks.Examples, torch_device) -> dict:
    """The steps `train_suite` times: "jax", the jitted data-parallel step of
    `study.train`, and "torch", PyTorch's on `torch_device` (None: no PyTorch)."""
    steps = {"jax": _jax_step(cfg, mesh, examples)[0]}  # its HLO unasked: not compiled
    if torch_device is not None:
        inputs, targets = np.asarray(examples.inputs), np.asarray(examples.targets)
        steps["torch"] = torch_baseline.step_runner(cfg, inputs, targets, mesh.size, torch_device)
    return steps


def step_profile_ms(cfg, mesh, examples: tasks.Examples, steps: int = 5) -> dict:
    """Milliseconds per step and device of the same step's operations by kind of work (a
    trace): the operations of one device overlap, so they add up to more than the step."""
    run, compiled_text = _jax_step(cfg, mesh, examples)
    run()  # compiled and warm before the trace
    return step_profile.profile(run, compiled_text(), steps, mesh.size)


def _jax_step(cfg, mesh, examples: tasks.Examples):
    """(a call of one training step that carries its state on, a call giving the step's
    compiled HLO): the HLO costs a compile of its own, so only a profile asks for it.
    The study's optimiser object makes a profile's step the timed one (`jitted_update`
    is cached by module, optimiser, mesh and shape): compiled once, not once more."""
    module, tx = model_lib.Transformer(cfg), study_train.adam(1e-3)
    state = study_train.create_state(module, jax.random.PRNGKey(0), tx, examples.inputs.shape[1])
    holder = [jax.device_put(state, parallel.replicated(mesh))]
    update = study_train.jitted_update(module, tx, mesh, examples.inputs.shape)
    key = jax.random.PRNGKey(2)
    batch = tasks.Examples(*(parallel.shard_batch(np.asarray(a), mesh) for a in examples))

    def run():
        holder[0], loss = update(holder[0], batch, key)
        return loss

    return run, lambda: update.lower(holder[0], batch, key).compile().as_text()


def train_suite(
    repeats: int = 20, heads=(1, 4, 8, 16), batch: int = 50, t: int = 100, layers: int = 4
):
    """Milliseconds per train step at the paper's size (`batch`, `t`, `layers`: the
    paper's by default) per head count: JAX, PyTorch on the same kind of device (on the
    CPU with as many threads as JAX has devices), timed in turns (`step_ms`), and both
    roofline floors (off the CPU the second is the first); a line per head count, then
    where the smallest and the largest head count's steps go (`step_profile`)."""
    mesh = parallel.data_mesh()
    exps = exp_per_s(repeats) if in_cache_yardsticks_apply() else None
    rates = (matmul_flops_per_s(repeats), copy_bytes_per_s(repeats), exps)
    rate, bandwidth, _ = rates
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), batch, t, 256)
    cfg = model_lib.ModelConfig(num_layers=layers, max_len=t)
    with_torch = torch_baseline.available()
    torch_device = torch_baseline.device_for(jax.default_backend()) if with_torch else None
    print(f"batch {batch}, T={t}, d=64, {layers} layers, {mesh.size} device(s)")
    print(
        f"step {train_step_flops(cfg, batch, t) / 1e9:.2f} GFLOP; matmul {rate / 1e9:.0f} GFLOP/s; "
        f"copy {bandwidth / 1e9:.1f} GB/s; "
        + (f"exp {exps / 1e9:.2f} G/s; " if exps is not None else "exp: no floor off the CPU; ")
        + ("PyTorch " if with_torch else "PyTorch baseline: skipped (pip install torch)")
        + (f"{_torch_version()} {_torch_where(torch_device, mesh.size)}" if with_torch else "")
    )
    rows = {}
    for h in heads:
        cfg = model_lib.ModelConfig(num_heads=h, num_layers=layers, max_len=t)
        row = step_ms(training_steps(cfg, mesh, examples, torch_device), repeats)
        row["roofline"] = roofline_ms(cfg, batch, t, rate, bandwidth)
        row["roofline_with_exp"] = roofline_ms(cfg, batch, t, rate, bandwidth, exps)
        rows[str(h)] = row
        _print_row(h, row, batch * t)
    result = _result(rows, mesh.size, rates, cfg, batch, t)
    result["step_profiles_ms"] = {}
    for h in sorted({min(heads), max(heads)}):
        cfg = model_lib.ModelConfig(num_heads=h, num_layers=layers, max_len=t)
        profile = step_profile_ms(cfg, mesh, examples)
        _print_profile(h, profile, rows[str(h)]["jax"])
        result["step_profiles_ms"][str(h)] = profile
    print_result([], result)
    return result


def _print_profile(h: int, profile: dict, jax_ms: float) -> None:
    """Where a step goes. A device runs independent operations at once, so its
    operations' times add up to more than the step: they are shown as shares."""
    busy = sum(profile.values())
    print(f"H={h} step ({jax_ms:.1f} ms) by kind of work, share of the operations' time:")
    for kind, ms in profile.items():
        print(f"  {ms / busy:6.1%}  {kind}")


def _torch_version() -> str:
    import torch

    return torch.__version__


def _torch_where(device: str, threads: int) -> str:
    return f"with {threads} thread(s)" if device == "cpu" else f"on {device}"


def _print_row(h: int, row: dict, tokens: int) -> None:
    line = f"H={h:>2}: {row['jax']:7.1f} ms/step {tokens / row['jax'] * 1e3:9.0f} tokens/s"
    line += f"; floor {row['roofline']:6.1f} ms ({row['jax'] / row['roofline']:4.2f}x)"
    with_exp = row["roofline_with_exp"]
    line += f", with exp {with_exp:6.1f} ms ({row['jax'] / with_exp:4.2f}x)"
    if "torch" in row:
        line += f"; PyTorch {row['torch']:7.1f} ms ({row['torch'] / row['jax']:4.2f}x slower)"
    print(line, flush=True)


def _result(rows: dict, devices: int, rates: tuple, cfg, batch, t) -> dict:
    """The JSON line: `rates` are the machine's (matmul FLOP/s, copy bytes/s, exp/s or
    None where exponentials bound nothing, and the second floor is the first)."""
    rate, bandwidth, exps = rates
    flops = train_step_flops(cfg, batch, t)
    ms = {h: r["jax"] for h, r in rows.items()}
    result = {
        "devices": devices,
        "matmul_gflops": rate / 1e9,
        "copy_gb_per_s": bandwidth / 1e9,
        "exp_g_per_s": None if exps is None else exps / 1e9,
        "step_gflop": flops / 1e9,
        "floor_ms": 1e3 * flops / rate,  # FLOPs alone
        "attention_passes": ATTENTION_PASSES,
        "roofline_ms": {h: r["roofline"] for h, r in rows.items()},
        "ms_per_step": ms,
        "tokens_per_s": {h: batch * t / (v / 1e3) for h, v in ms.items()},
        "x_floor": {h: v / (1e3 * flops / rate) for h, v in ms.items()},
        "x_roofline": {h: r["jax"] / r["roofline"] for h, r in rows.items()},
        "roofline_with_exp_ms": {h: r["roofline_with_exp"] for h, r in rows.items()},
        "x_roofline_with_exp": {h: r["jax"] / r["roofline_with_exp"] for h, r in rows.items()},
        "ratio_16_to_1": ms["16"] / ms["1"] if {"1", "16"} <= ms.keys() else None,
    }
    if all("torch" in r for r in rows.values()):
        result["torch_ms_per_step"] = {h: r["torch"] for h, r in rows.items()}
        result["speedup_vs_torch"] = {h: r["torch"] / r["jax"] for h, r in rows.items()}
    return result
