"""The benchmark suites by name, as `launch/benchmark.py` runs them: each suite is the
module of its name."""

from __future__ import annotations

from collections.abc import Callable

from beyondpar.benchmarks.coalitions import coalitions_suite
from beyondpar.benchmarks.corpus import corpus_suite
from beyondpar.benchmarks.load import load_suite
from beyondpar.benchmarks.metrics import metrics_suite
from beyondpar.benchmarks.pretrained import pretrained_suite
from beyondpar.benchmarks.synergy import synergy_suite
from beyondpar.benchmarks.train import train_suite

SUITES: dict[str, Callable[..., dict]] = {
    "metrics": metrics_suite,
    "train": train_suite,
    "synergy": synergy_suite,
    "pretrained": pretrained_suite,
    "corpus": corpus_suite,
    "load": load_suite,
    "coalitions": coalitions_suite,
}
