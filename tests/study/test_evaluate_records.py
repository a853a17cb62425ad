"""Evaluation on tiny inputs: held-out sequences, checkpoint choice, per-sequence axes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import tasks
from beyondpar.study import config_lib, evaluate


def _small_config(seed: int):
    config = config_lib.base_config()
    config.seed = seed
    config.task.name = "shift"
    config.task.seq_len = 12
    config.task.lag = 2
    config.model.vocab_size = 7
    config.model.max_len = 12
    return config


def test_eval_examples_depend_on_the_evaluation_seed_only():
    """Held-out sequences are drawn from the evaluation seed, so runs trained with
    different seeds are scored on the very same sequences (and never on their own
    training stream)."""
    spec = evaluate.EvalSpec(num_sequences=5, seed=99)
    a = evaluate.eval_examples(_small_config(seed=3), spec)
    b = evaluate.eval_examples(_small_config(seed=11), spec)
    assert a.inputs.shape == (5, 12)
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.targets, b.targets)
    expected = tasks.make_examples("shift", jax.random.PRNGKey(99), 5, 12, 7, 2)
    np.testing.assert_array_equal(a.inputs, expected.inputs)
    other = evaluate.eval_examples(
        _small_config(seed=3), evaluate.EvalSpec(num_sequences=5, seed=3)
    )
    assert not np.array_equal(a.inputs, other.inputs)


def _run_with_steps(root, name, steps):
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    for step in steps:
        (run / "checkpoints" / str(step)).mkdir()
    return run


def test_latest_pairs_take_the_newest_step_and_all_takes_every_step(tmp_path):
    """`latest` evaluates the highest saved step (not the first saved), `all` every saved
    step in order, and a run with no checkpoint is paired with None."""
    a = _run_with_steps(tmp_path, "a", [5, 40, 200])
    b = _run_with_steps(tmp_path, "b", [])
    assert list(evaluate._pairs([a, b], "latest")) == [(a, 200), (b, None)]
    assert list(evaluate._pairs([a], "all")) == [(a, 5), (a, 40), (a, 200)]


def test_accuracies_are_per_sequence():
    """Accuracies have one value per sequence (the mean over its positions); the
    predictable accuracy counts only masked positions, and a sequence with none is 0."""
    # 3 sequences of 4 positions, vocab 2: the argmax is the token with logit 1.
    predicted = np.array([[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])
    logits = jax.nn.one_hot(predicted, 2)
    targets = np.zeros((3, 4), np.int32)
    mask = np.array(
        [[True, True, False, False], [True, False, True, False], [False] * 4], dtype=bool
    )
    examples = tasks.Examples(jnp.zeros((3, 4), jnp.int32), jnp.asarray(targets), mask)
    acc = evaluate._accuracies(logits, examples)
    np.testing.assert_allclose(acc["accuracy"], [1.0, 0.5, 0.25])
    np.testing.assert_allclose(acc["accuracy_predictable"], [1.0, 0.5, 0.0])
    summary = evaluate.summarize({"accuracy": acc["accuracy"]})["accuracy"]
    assert summary["mean"] == pytest.approx(np.mean([1.0, 0.5, 0.25]))
    assert summary["std"] == pytest.approx(np.std([1.0, 0.5, 0.25]))


def test_upgrade_reads_a_first_format_optimum_as_in_sample():
    """A record without a "format" key is format 1: its optimum was scored in sample, so it
    is read under the `_in_sample` names, never under the held-out ones."""
    old = {"run": "r", "metrics": {"fidelity_optimal": 0.9, "fidelity_uniform": 0.5}}
    got = evaluate.upgrade(old)
    assert got["format"] == evaluate.RECORD_FORMAT
    assert got["metrics"] == {"fidelity_optimal_in_sample": 0.9, "fidelity_uniform": 0.5}
    current = {"run": "r", "format": evaluate.RECORD_FORMAT, "metrics": {"fidelity_optimal": 1}}
    assert evaluate.upgrade(current) == current
    with pytest.raises(ValueError, match="record format"):
        evaluate.upgrade({**current, "format": evaluate.RECORD_FORMAT + 1})


def test_read_records_names_lines_that_are_not_records(tmp_path):
    """A line that is not a record is skipped and named in `problems`; the others are read
    (first-format ones upgraded)."""
    keys = {"run": "r", "step": 1, "task": "t", "heads": 2, "layers": 1}
    good = {**keys, "metrics": {"fidelity_optimal": 0.7}}
    path = tmp_path / "records.jsonl"
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({"run": "r"}) + "\n" + json.dumps(good) + "\n"
    )
    problems = []
    got = evaluate.read_records(path, problems)
    assert [r["metrics"] for r in got] == [{"fidelity_optimal_in_sample": 0.7}] * 2
    assert len(problems) == 1
