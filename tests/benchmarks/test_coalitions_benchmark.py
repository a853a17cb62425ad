"""The coalitions suite on tiny shapes: both parts timed, counted and printed; and it
measures what it reports: the last layers of the 16-head model, and with repeats the best
call after the compiling one. Both tests run its SmolLM2 part on one tiny shape, and its
16-head part on one model: compiled once, in one process."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import coalitions as coalitions_lib
from beyondpar import model as model_lib
from beyondpar import tasks
from beyondpar.benchmarks import coalitions
from beyondpar.benchmarks.models import SMOLLM2_135M

# SmolLM2's family and fields, shrunk: 2 layers of 3 heads (8 coalitions a layer) sharing
# one key-value head.
TINY_SMOLLM2 = {
    **SMOLLM2_135M,
    **dict(vocab_size=64, hidden_size=24, intermediate_size=32, num_hidden_layers=2),
    **dict(num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=64),
}


def test_coalitions_suite_times_both_models(capsys, monkeypatch):
    monkeypatch.setattr(coalitions, "matmul_flops_per_s", lambda repeats: 87.6e9)
    r = coalitions.coalitions_suite(
        windows=3, tokens=12, sequences=2, smollm2_config=TINY_SMOLLM2, paper_heads=2, repeats=2
    )
    small, paper = r["smollm2"], r["paper_16_heads"]
    assert (small["layers"], small["heads"], small["coalitions"]) == (2, 3, 16)
    assert (small["sequences"], small["tokens"]) == (3, 12)
    assert (paper["layers"], paper["heads"], paper["coalitions"]) == (1, 2, 4)
    assert (paper["sequences"], paper["tokens"]) == (2, 100)
    assert small["coalitions_per_s"] == pytest.approx(16 / small["values_s"])
    assert paper["mixes_per_s"] == pytest.approx(4 * 2 / paper["values_s"])
    assert np.isfinite(small["mean_all_minus_empty"]) and r["matmul_gflop_per_s"] == 87.6
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].endswith("matmul 88 GFLOP/s") and out[-1].startswith('{"devices"')
    assert "coalitions/s" in out[2] and "paper 2 heads shape, random weights" in out[3]


def test_suite_measures_the_last_layers_and_times_the_best_later_call(monkeypatch):
    """The 16-head part measures the model's last `paper_layers` layers, and `repeats` > 1
    reports the best call after the first (a clock that only grows: the later ones)."""
    clock = iter(range(1, 1000))
    monkeypatch.setattr(coalitions, "timed", lambda fn: (fn(), float(next(clock))))
    # The SmolLM2 part on the shapes of the test above.
    result = coalitions.coalitions_suite(
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
    last = coalitions_lib.values(np.asarray(attn, np.float32)[:, -1])
    paper = result["paper_16_heads"]
    assert paper["mean_all_minus_empty"] == pytest.approx(
        float(np.mean(last[:, -1] - last[:, 0])), rel=1e-5
    )
