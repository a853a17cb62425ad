"""Speed as ratios measured in one run, one module per suite, named after it: `metrics`
(the kernels), `train`, `synergy` (evaluation of a checkpoint), `pretrained` (a text
through a real model's shape), `corpus` and `load` (GGUF files). Beside them what they
measure against: `baselines` (the paper's method, a NumPy loop), `reference_gguf` (the
reference GGUF reader), `torch_baseline`, and the machine's own yardsticks (`machine`).
`SUITES` names the suites for `launch/benchmark.py`."""

from beyondpar.benchmarks.suites import SUITES  # noqa: F401
