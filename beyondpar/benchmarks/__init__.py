"""Speed as ratios measured in one run: kernels, training, evaluation of a checkpoint,
a text and a corpus through real-model shapes. `SUITES` names them for
`launch/benchmark.py`."""

from beyondpar.benchmarks.suites import SUITES  # noqa: F401
