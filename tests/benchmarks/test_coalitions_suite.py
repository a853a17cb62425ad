"""The coalitions benchmark measures what it reports: the last layers of the 16-head
model, and with repeats the best call after the compiling one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import coalitions, tasks
from beyondpar import model as model_lib
from beyondpar.benchmarks import coalitions as bench
from helpers.tiny_models import TINY_SMOLLM2


def test_suite_measures_the_last_layers_and_times_the_best_later_call(monkeypatch):
    """The 16-head part measures the model's last `paper_layers` layers, and `repeats` > 1
    reports the best call after the first (a clock that only grows: the later ones)."""
    clock = iter(range(1, 1000))
    monkeypatch.setattr(bench, "timed", lambda fn: (fn(), float(next(clock))))
    # The SmolLM2 part on the shapes of the suite's other test (compiled once for both).
    result = bench.coalitions_suite(
        repeats=3,
        windows=3,
        tokens=12,
        sequences=2,
        paper_layers=1,
        smollm2_config=TINY_SMOLLM2,
        paper_heads=2,
    )
    small = result["smollm2"]
    assert small["values_first_call_s"] < small["values_s"]
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=2))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), 2, 100, 256)
    _, attn = model_lib.apply_with_attention(module, params, jnp.asarray(examples.inputs))
    last = coalitions.values(np.asarray(attn, np.float32)[:, -1])
    paper = result["paper_16_heads"]
    assert paper["mean_all_minus_empty"] == pytest.approx(
        float(np.mean(last[:, -1] - last[:, 0])), rel=1e-5
    )
