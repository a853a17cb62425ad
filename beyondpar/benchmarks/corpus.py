"""Speed and memory of a corpus analysis on a real model's shape: windows of T tokens
through a model built from SmolLM2-135M's config (random weights, nothing downloaded),
every per-layer analysis on except the optimal-weight search, timed part by part."""

from __future__ import annotations

import tempfile
import time

import jax
import numpy as np

from beyondpar import measure
from beyondpar.analysis import corpus as corpus_lib
from beyondpar.analysis import corpus_report, statistics, windowing
from beyondpar.base import settings
from beyondpar.base.timing import Timer, timed
from beyondpar.benchmarks.machine import matmul_flops_per_s, peak_rss_gb
from beyondpar.benchmarks.models import SMOLLM2_135M, random_model
from beyondpar.benchmarks.printing import print_result


def random_windows(num_windows: int, tokens: int, vocab: int, seed: int = 0) -> windowing.Windows:
    """`num_windows` windows of random token ids, four windows per 'document'."""
    ids = np.random.default_rng(seed).integers(0, vocab, (num_windows, tokens), dtype=np.int32)
    return windowing.Windows(
        tokens=ids,
        document=np.arange(num_windows) // 4,
        num_documents=-(-num_windows // 4),
        documents_used=-(-num_windows // 4),
        dropped_tail_tokens=0,
        short_documents=0,
        total_windows=num_windows,
        sources=["random"],
    )


def corpus_suite(
    repeats: int = 1,
    windows: int = 100,
    tokens: int = 512,
    batch_size: int = 8,
    config: dict | None = None,
) -> dict:
    """One pass over `windows` windows (`repeats` is accepted for the CLI; a pass over
    100 windows already averages over 13 batches, the first one compiling), with a
    progress bar over the windows. The machine's float32 matmul rate, measured first in
    the same run, tells runs on a slower or busier day apart."""
    del repeats
    rate = matmul_flops_per_s(3)
    config = dict(SMOLLM2_135M if config is None else config)
    (module, params), build_s = timed(lambda: random_model(config))
    seconds = {"build + random init": build_s}
    data = random_windows(windows, tokens, config["vocab_size"])
    spec = measure.MeasureSpec(pairwise=False, sink_tokens=1)
    timer = Timer()
    records = {}
    start = time.perf_counter()
    corpus_lib.analyze_windows(
        module,
        params,
        data,
        list(range(windows)),
        spec,
        batch_size,
        lambda i, line: records.__setitem__(i, settings.json_form(line)),
        timer=timer,
        progress=True,  # a pass takes minutes: a bar on stderr, the figures on stdout
    )
    windows_s = time.perf_counter() - start
    seconds.update(timer.seconds)
    seconds["records (window lines)"] = windows_s - sum(timer.seconds.values())
    seconds.update(_summary_and_report_seconds(records, data, spec, tokens, batch_size))
    result = {
        "windows": windows,
        "tokens": tokens,
        "batch_size": batch_size,
        "layers": module.config.num_layers,
        "heads": module.config.num_heads,
        "devices": len(jax.local_devices()),
        "matmul_gflop_per_s": rate / 1e9,
        "seconds": seconds,
        "total_s": sum(seconds.values()),
        "peak_rss_gb": peak_rss_gb(),
    }
    print_result(_lines(result), result)
    return result


def _summary_and_report_seconds(records, data, spec, tokens: int, batch_size: int) -> dict:
    """Time the corpus summary (bootstrap intervals) and its report, as a user's run does."""
    seconds = {}
    start = time.perf_counter()
    summary = statistics.summarize([records[i] for i in range(len(records))])
    cspec = corpus_lib.CorpusSpec(tokens=tokens, batch_size=batch_size)
    summary.update(
        corpus_lib.description("random SmolLM2-135M shape", "random ids", data, cspec, spec),
        baseline=measure.baselines(tokens, spec),
    )
    seconds["summary (bootstrap intervals)"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        corpus_report.write(summary, out)
        seconds["report (markdown + plots)"] = time.perf_counter() - start
    return seconds


def _lines(result: dict):
    """The summary lines of a result, before its JSON line."""
    yield (
        f"{result['windows']} windows x {result['tokens']} tokens, {result['layers']} layers x "
        f"{result['heads']} heads, batch {result['batch_size']}, {result['devices']} device(s), "
        f"matmul {result['matmul_gflop_per_s']:.0f} GFLOP/s"
    )
    for name, sec in result["seconds"].items():
        yield f"{name:<34} {sec:8.2f} s ({sec / result['total_s']:5.1%})"
    yield f"{'total':<34} {result['total_s']:8.2f} s; peak RSS {result['peak_rss_gb']:.2f} GB"
