"""Speed and memory of loading GGUF files, against the reference reader in the same run
(`reference_gguf`, the path the package had before; "previous" in the output): a file
of Qwen2.5-0.5B's shape in llama.cpp's Q4_K_M mix (random weights, written once into a
temporary folder) and the packaged SmolLM2-135M Q4_1. Every load runs in a fresh process
(`single_load`: what a user pays, compilation included, and its own peak memory), the
two paths interleaved so that the machine's load falls on both; the best of `repeats`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from beyondpar.benchmarks import gguf_models
from beyondpar.benchmarks.models import smollm2_gguf
from beyondpar.benchmarks.printing import print_result


def one_load(path, which: str) -> dict:
    """Seconds, peak RSS (GB) and per-parameter sums of one load in a fresh process
    (`single_load`); `which` is "new" or "previous"."""
    done = subprocess.run(
        [sys.executable, "-m", "beyondpar.benchmarks.single_load", str(path), which],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"loading {path} ({which}) failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(path, repeats: int) -> dict:
    """Both paths on one file, interleaved, `repeats` times each."""
    runs: dict[str, list] = {"new": [], "previous": []}
    for _ in range(max(repeats, 1)):
        for which in ("previous", "new"):
            runs[which].append(one_load(path, which))
    new, old = runs["new"], runs["previous"]
    best = min(r["seconds"] for r in new)
    best_old = min(r["seconds"] for r in old)
    return {
        "seconds": best,
        "previous_seconds": best_old,
        "speedup": best_old / best,
        "peak_rss_gb": max(r["peak_rss_gb"] for r in new),
        "previous_peak_rss_gb": max(r["peak_rss_gb"] for r in old),
        "rss_before_load_gb": new[0]["rss_before_load_gb"],
        "weights_gb": new[0]["weights_gb"],
        "same_values": all(r["checksum"] == old[0]["checksum"] for r in new + old),
        "all_seconds": [r["seconds"] for r in new],
        "all_previous_seconds": [r["seconds"] for r in old],
    }


def load_suite(repeats: int = 3, config: dict | None = None, smollm2: bool = True) -> dict:
    """A Qwen2.5-0.5B-shaped Q4_K_M file (or `config`'s shape) and, when installed and
    `smollm2`, the packaged SmolLM2-135M, each loaded by both paths."""
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qwen2.5-0.5b-shape.Q4_K_M.gguf"
        start = time.perf_counter()
        types = gguf_models.write_qwen2_gguf(path, config)
        write_s = time.perf_counter() - start
        results["qwen2.5-0.5b shape, Q4_K_M mix"] = {
            "types": types,
            "file_gb": path.stat().st_size / 2**30,
            **compare(path, repeats),
        }
    packaged = smollm2_gguf() if smollm2 else None
    if packaged is not None:
        results["SmolLM2-135M Q4_1"] = {
            "file_gb": packaged.stat().st_size / 2**30,
            **compare(packaged, repeats),
        }
    result = {
        "cores": len(os.sched_getaffinity(0)),
        "load_average_before": load_before[0],
        "load_average_after": os.getloadavg()[0],
        "write_s": write_s,
        "files": results,
    }
    print_result(_lines(result), result)
    return result


def _lines(result: dict):
    """The summary lines of a result, before its JSON line."""
    yield (
        f"{result['cores']} cores, load average {result['load_average_before']:.1f} before, "
        f"{result['load_average_after']:.1f} after"
    )
    for name, r in result["files"].items():
        yield (
            f"{name:<34} {r['seconds']:6.2f} s (previous {r['previous_seconds']:6.2f} s, "
            f"{r['speedup']:4.1f}x); peak RSS {r['peak_rss_gb']:.2f} GB (previous "
            f"{r['previous_peak_rss_gb']:.2f}; weights {r['weights_gb']:.2f}, before load "
            f"{r['rss_before_load_gb']:.2f}); same values: {r['same_values']}"
        )
