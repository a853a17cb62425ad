"""Speed of evaluating one paper-sized checkpoint with every synergy analysis on, part
by part (metrics, optimal weights, pruning curves) and whole."""

from __future__ import annotations

import jax

from beyondpar import model as model_lib
from beyondpar import tasks
from beyondpar.base.timing import timed
from beyondpar.benchmarks.machine import matmul_flops_per_s
from beyondpar.benchmarks.printing import print_result
from beyondpar.study import evaluate, pruning_curves


def synergy_suite(
    repeats: int = 1, sequences: int = 50, heads: int = 16, t: int = 100, layers: int = 4
) -> dict:
    """Evaluation of one paper-sized checkpoint (`t` tokens, `layers` layers: the paper's
    by default) with every analysis on, part by part; the first call includes
    compilation, the best of `repeats` later calls does not; a line per part as it
    finishes, after the machine's float32 matmul rate (measured in the same run: it tells
    a slower or busier day apart)."""
    module = model_lib.Transformer(
        model_lib.ModelConfig(num_heads=heads, num_layers=layers, max_len=t)
    )
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), sequences, t, 256)
    # Placed as the evaluation places them: each part runs the programs the whole
    # evaluation runs, whose first call then compiles only what no part does.
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    params, inputs = evaluate.placed(params, examples.inputs)
    spec = evaluate.EvalSpec(num_sequences=sequences)
    parts = {
        "metrics + diversity + pairwise + cross-head": lambda: evaluate.per_sequence(
            module, params, examples, evaluate.EvalSpec(optimal_weights=False, pruning=False)
        ),
        "optimal weights (both objectives)": lambda: evaluate.optimal_mixes(
            *evaluate.forward(module, params, inputs)[1:], spec
        ),
        "pruning (4 orders)": lambda: _pruning(module, params, examples, inputs, spec),
    }
    devices, rate = len(jax.local_devices()), matmul_flops_per_s(3)
    print(
        f"{heads} heads, {sequences} sequences of {t} tokens, {devices} device(s), "
        f"matmul {rate / 1e9:.0f} GFLOP/s"
    )
    cold, warm = {}, {}
    for name, fn in parts.items():
        _, cold[name] = timed(fn)
        warm[name] = min(timed(fn)[1] for _ in range(repeats))
        print(f"{name:<46} {warm[name]:7.2f} s; first call {cold[name]:6.2f} s", flush=True)
    _, total_cold = timed(lambda: evaluate.evaluate_params(module, params, examples, spec))
    total = min(
        timed(lambda: evaluate.evaluate_params(module, params, examples, spec))[1]
        for _ in range(repeats)
    )
    result = {
        "heads": heads,
        "sequences": sequences,
        "devices": devices,
        "matmul_gflop_per_s": rate / 1e9,
        "seconds_warm": warm,
        "seconds_first_call": cold,
        "total_s": total,
        "total_first_call_s": total_cold,
        "share": {name: v / sum(warm.values()) for name, v in warm.items()},
    }
    shares = ", ".join(f"{name} {share:.0%}" for name, share in result["share"].items())
    total_line = (
        f"{'full evaluation (evaluate_params)':<46} {total:7.2f} s; first call {total_cold:6.2f} s"
    )
    print_result([total_line, f"shares of the parts: {shares}"], result)
    return result


def _pruning(module, params, examples, inputs, spec):
    _, attn, weights = evaluate.forward(module, params, inputs)
    return pruning_curves.pruning_curves(module, params, examples, weights, attn, spec)
