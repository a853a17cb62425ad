"""Tasks: targets, predictable positions, determinism and errors."""

import jax
import numpy as np
import pytest

from beyondpar import tasks

KEY = jax.random.PRNGKey(0)


def make(name, lag=1, t=10, v=7):
    ex = tasks.make_examples(name, KEY, 5, t, v, lag)
    return tuple(np.asarray(a) for a in ex)


def test_copy_zero_cycle():
    x, y, m = make("copy")
    np.testing.assert_array_equal(y, x)
    assert m.all()
    x, y, m = make("zero")
    assert (y == 0).all() and m.all()
    x, y, m = make("cycle")
    np.testing.assert_array_equal(y[:, 1:], x[:, :-1])
    np.testing.assert_array_equal(y[:, 0], x[:, -1])
    assert not m[:, 0].any() and m[:, 1:].all()
    assert x.min() >= 0 and x.max() < 7 and x.dtype == np.int32


def test_shift_and_pair_sum():
    x, y, m = make("shift", lag=3)
    np.testing.assert_array_equal(y[:, 3:], x[:, :-3])
    np.testing.assert_array_equal(m[0], np.arange(10) >= 3)
    x, y, m = make("pair_sum", lag=4)
    np.testing.assert_array_equal(y[:, 4:], (x[:, 3:-1] + x[:, :-4]) % 7)
    np.testing.assert_array_equal(m[0], np.arange(10) >= 4)


def test_deterministic_in_the_key():
    # The sizes of `make`: the programs that drew its sequences draw these.
    a = tasks.make_examples("cycle", KEY, 5, 10, 7)
    b = tasks.make_examples("cycle", KEY, 5, 10, 7)
    c = tasks.make_examples("cycle", jax.random.PRNGKey(1), 5, 10, 7)
    np.testing.assert_array_equal(a.inputs, b.inputs)
    assert not np.array_equal(a.inputs, c.inputs)


@pytest.mark.parametrize(
    "args,message",
    [
        (("copyy", KEY, 2, 8, 5), r"task name must be one of .*, got 'copyy'"),
        (("copy", KEY, 0, 8, 5), "num must be an integer >= 1, got 0"),
        (("copy", KEY, 2, 1, 5), "seq_len must be an integer >= 2, got 1"),
        (("copy", KEY, 2, 8, 1), "vocab_size must be an integer >= 2, got 1"),
        (("shift", KEY, 2, 8, 5, 8), r"lag for task 'shift' must be in \[1, 8\), got 8"),
        (("pair_sum", KEY, 2, 8, 5, 1), r"lag for task 'pair_sum' must be in \[2, 8\), got 1"),
    ],
)
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        tasks.make_examples(*args)


def test_induction_repeats_a_distinct_prefix_and_predicts_the_follower():
    ex = tasks.make_examples("induction", jax.random.PRNGKey(2), 5, 12, 20)
    x, y, m = (np.asarray(a) for a in ex)
    np.testing.assert_array_equal(x[:, 6:], x[:, :6])
    assert all(len(set(row[:6].tolist())) == 6 for row in x)  # distinct: one earlier occurrence
    for i in range(6, 12):
        j = i - 6  # the earlier occurrence of x[i]; the target is the token after it
        np.testing.assert_array_equal(y[:, i], x[:, j + 1])
    np.testing.assert_array_equal(m, np.broadcast_to(np.arange(12) >= 6, (5, 12)))
    # In the prefix the target is the next, fresh token: never one seen at or before i.
    np.testing.assert_array_equal(y[:, :5], x[:, 1:6])
    assert not any(y[n, i] in x[n, : i + 1] for n in range(5) for i in range(5))
    assert "induction" in tasks.ATTENTION_TASKS and "copy" not in tasks.ATTENTION_TASKS
    with pytest.raises(ValueError, match="seq_len for task 'induction' must be even, got 11"):
        tasks.make_examples("induction", jax.random.PRNGKey(0), 2, 11, 20)
    with pytest.raises(ValueError, match=r"vocab_size for task 'induction' must be >= seq_len / 2"):
        tasks.make_examples("induction", jax.random.PRNGKey(0), 2, 12, 5)


def test_induction_prefixes_differ_across_rows_and_across_keys():
    # The sizes of the test above: the same programs draw these.
    one = np.asarray(tasks.make_examples("induction", jax.random.PRNGKey(0), 5, 12, 20).inputs)
    other = np.asarray(tasks.make_examples("induction", jax.random.PRNGKey(1), 5, 12, 20).inputs)
    prefixes = {tuple(row[:6]) for row in one}
    assert len(prefixes) == 5  # every row its own random prefix
    assert not (one == other).all(axis=1).any()  # another key, other sequences
    np.testing.assert_array_equal(one[:, :6], one[:, 6:])


@pytest.mark.parametrize("name,lag", [("copy", 1), ("cycle", 1), ("shift", 2), ("pair_sum", 3)])
def test_inputs_use_the_whole_vocabulary(name, lag):
    """Uniform tokens cover every id in [0, V): 1,000 draws from V = 3 miss none, so the
    largest id V - 1 must occur and nothing outside the range may."""
    ex = tasks.make_examples(name, jax.random.PRNGKey(5), 40, 25, 3, lag)
    x, y = np.asarray(ex.inputs), np.asarray(ex.targets)
    assert set(np.unique(x).tolist()) == {0, 1, 2}
    assert y.min() >= 0 and y.max() <= 2
    counts = np.bincount(x.ravel(), minlength=3)
    assert counts.min() > 250  # about 1000 / 3 each


def test_induction_accepts_a_vocabulary_exactly_as_large_as_the_prefix():
    """With V = T / 2 the prefix of distinct tokens is a permutation of the whole
    vocabulary: the smallest vocabulary that still makes the task, so it must be accepted
    (and one token fewer must not)."""
    ex = tasks.make_examples("induction", jax.random.PRNGKey(3), 4, 10, 5)
    x = np.asarray(ex.inputs)
    for row in x:
        assert sorted(row[:5].tolist()) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(x[:, 5:], x[:, :5])
    tasks.check("induction", 10, 5)
    with pytest.raises(ValueError, match=r"must be >= seq_len / 2 = 5 .*got 4"):
        tasks.check("induction", 10, 4)
