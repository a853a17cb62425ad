"""The benchmark suites by name, as `launch/benchmark.py` runs them."""

from __future__ import annotations

from collections.abc import Callable

from beyondpar.benchmarks.corpus import corpus_suite
from beyondpar.benchmarks.evaluation import synergy_suite
from beyondpar.benchmarks.kernels import metrics_suite
from beyondpar.benchmarks.load import load_suite
from beyondpar.benchmarks.text import pretrained_suite
from beyondpar.benchmarks.training import train_suite

SUITES: dict[str, Callable[..., dict]] = {
    "metrics": metrics_suite,
    "train": train_suite,
    "synergy": synergy_suite,
    "pretrained": pretrained_suite,
    "corpus": corpus_suite,
    "load": load_suite,
}
