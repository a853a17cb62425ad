"""Accuracy on predictable positions: pooled or per sequence, NumPy or under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import batches, tasks

# Two sequences of 4 positions; the logits' most likely tokens are 0, 1, 2, 0 and 1, 1, 1, 1.
LOGITS = np.eye(3)[[[0, 1, 2, 0], [1, 1, 1, 1]]].astype(np.float32)
TARGETS = np.array([[0, 1, 0, 0], [1, 2, 2, 2]])
PREDICTABLE = np.array([[False, True, True, True], [False, False, False, False]])
BATCH = batches.Batch(np.zeros((2, 4), np.int32), TARGETS, PREDICTABLE)


def test_hits_and_counts_over_predictable_positions_only():
    hits, count = batches.predictable_hits(LOGITS, BATCH, axis=-1)
    np.testing.assert_array_equal(hits, [2, 0])  # position 0 is right but unpredictable
    np.testing.assert_array_equal(count, [3, 0])


def test_pooled_and_per_sequence_accuracy_with_none_predictable_as_zero():
    assert batches.accuracy(LOGITS, BATCH) == pytest.approx(2 / 3)
    np.testing.assert_allclose(batches.accuracy(LOGITS, BATCH, axis=-1), [2 / 3, 0.0])


def test_numpy_stays_numpy_float64_and_traced_inputs_stay_in_jit():
    """NumPy inputs keep NumPy's float64 division; traced ones run inside jit."""
    per_sequence = batches.accuracy(LOGITS, BATCH, axis=-1)
    assert isinstance(per_sequence, np.ndarray) and per_sequence.dtype == np.float64
    traced = jax.jit(batches.accuracy)(jnp.asarray(LOGITS), batches.Batch(*map(jnp.asarray, BATCH)))
    assert isinstance(traced, jax.Array) and float(traced) == pytest.approx(2 / 3)


def test_a_tasks_examples_are_a_batch():
    assert tasks.Examples is batches.Batch
    examples = tasks.make_examples("cycle", jax.random.PRNGKey(0), 2, 6, 5)
    assert isinstance(examples, batches.Batch)
