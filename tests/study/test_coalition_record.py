"""The heads' coalitions in the study's evaluation (`evaluation.coalitions`): both games'
Shapley values add up to what they should, and the report's rows are the record's."""

import jax
import numpy as np
import pytest

from beyondpar import model as model_lib
from beyondpar import pruning, tasks
from beyondpar.study import evaluate, report

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=2, mlp_dim=24, max_len=12)
# Each sequence's loss under a head mask as one compiled program (not op by op).
sequence_losses = jax.jit(pruning.sequence_losses, static_argnums=0)
SPEC = evaluate.EvalSpec(
    num_sequences=6, horizon=20, max_steps=20, optimal_weights=False, pruning=False
)


@pytest.fixture(scope="module")
def evaluated():
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=4, **SMALL))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), 6, 12, 11)
    spec = evaluate.EvalSpec(**{**SPEC.__dict__, "coalitions": True})
    info = dict(run="small", step=1, task="copy", seed=0)
    return (
        module,
        params,
        examples,
        evaluate.evaluate_params(module, params, examples, spec, **info),
    )


def test_no_coalitions_unless_the_config_asks(evaluated):
    module, params, examples, _ = evaluated
    plain = evaluate.evaluate_params(module, params, examples, SPEC, run="r", step=1, task="copy")
    assert "coalitions" not in plain
    assert evaluate.EvalSpec().coalitions is False


def test_shapley_values_add_up_to_the_mix_and_to_the_masked_layers_cost(evaluated):
    module, params, examples, found = evaluated
    fidelity = found["metrics"]["fidelity"]["mean"]  # the learned mix, per layer
    loss = lambda m: sequence_losses(module, params, examples.inputs, examples.targets, m)
    full = loss(np.ones((2, 4), np.float32))
    for layer in range(2):
        games = found["coalitions"][str(layer)]
        assert sum(games["fidelity"]["shapley"]["mean"]) == pytest.approx(fidelity[layer], abs=1e-5)
        masked = np.ones((2, 4), np.float32)
        masked[layer] = 0.0
        cost = float(np.mean(loss(masked) - full))
        assert sum(games["loss"]["shapley"]["mean"]) == pytest.approx(cost, abs=1e-5)


def test_report_rows_are_the_records_values(evaluated):
    *_, found = evaluated
    text = report.markdown([found])
    assert "## Coalitions of heads: small" in text
    lines = text.splitlines()
    start = lines.index(
        "### Harsanyi dividends on the minimax fidelity of the coalition's mix (pp)"
    )
    cells = [c.strip() for c in lines[start + 4].strip("|").split("|")]
    best = found["coalitions"]["0"]["fidelity"]["strongest_negative_pair"]
    heads = "+".join(str(h + 1) for h in best["heads"])
    value = " ".join(f"{100 * best[k]:.3f}" for k in ("mean", "low", "high"))
    m, lo, hi = value.split()
    assert cells[0] == "1" and cells[2] == f"{heads}: {m} [{lo}, {hi}]"
    assert "coalitions_small_interaction_loss.png" in report.figures([found])
