"""Argument checks: numbers, counts and shares named in the message when wrong, arrays that
keep their dtype or say once that float64 is rounded, and each check accepting what its
docstring says and returning the value in the type it promises."""

from __future__ import annotations

import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar.base import checks


def test_lists_of_python_floats_are_not_float64_arrays_in_float32_mode(monkeypatch):
    """Python numbers take JAX's default dtype: in float32 mode a list is float32 and says
    nothing, while a float64 array is named once, before it is rounded."""
    monkeypatch.setattr(checks, "_warned_float64", False)
    with jax.enable_x64(False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert checks.as_float_array("weights", [0.25, 0.75]).dtype == np.float32
            assert checks.as_float_array("weights", ([1, 2], [3, 4])).dtype == np.float32
        with pytest.warns(UserWarning, match="weights is float64 but JAX runs in float32 mode"):
            assert checks.as_float_array("weights", np.array([0.25])).dtype == np.float32


def test_lists_and_tuples_of_float_arrays_keep_their_dtype_in_float64_mode():
    with jax.enable_x64(True):
        for stack in (list, tuple):
            rows = stack([np.ones(2, np.float32), np.zeros(2, np.float32)])
            assert checks.as_float_array("weights", rows).dtype == np.float32
            halves = stack([np.ones(2, np.float16), np.zeros(2, np.float16)])
            assert checks.as_float_array("weights", halves).dtype == np.float16
            assert checks.as_float_array("weights", stack([1, 2])).dtype == np.float64


def test_positive_int_rejects_zero_and_names_the_argument():
    """>= 1 means zero is refused, with the argument's name and the value in the message;
    one and numpy integers are accepted and come back as plain ints."""
    with pytest.raises(ValueError, match=r"^num_heads must be an integer >= 1, got 0$"):
        checks.positive_int("num_heads", 0)
    with pytest.raises(ValueError, match=r"got -3"):
        checks.positive_int("num_heads", -3)
    assert checks.positive_int("num_heads", 1) == 1
    out = checks.positive_int("num_heads", np.int32(7))
    assert out == 7 and type(out) is int


@pytest.mark.parametrize(
    "bad",
    [
        0,
        0.0,
        -1e-9,
        float("nan"),
        float("inf"),
        -float("inf"),
        True,
        np.bool_(True),
        "0.1",
        None,
        [0.1],
        np.array([0.1]),
        10**400,
    ],
)
def test_positive_number_refuses_what_is_not_a_finite_number_above_zero(bad):
    """A rate must be a real number strictly above 0 and finite: zero, negatives, NaN,
    infinities, bools, strings, lists, 1-element arrays and an int too large for a float
    are each refused naming the argument."""
    with pytest.raises(ValueError, match=r"^learning_rate must be a finite number > 0, got "):
        checks.positive_number("learning_rate", bad)


@pytest.mark.parametrize(
    "good, want",
    [
        (3, 3.0),
        (1e-12, 1e-12),
        (np.int64(2), 2.0),
        (np.float32(0.5), 0.5),
        (jnp.float32(0.25), 0.25),
    ],
)
def test_positive_number_returns_a_plain_float(good, want):
    """Python, NumPy and 0-d JAX numbers above 0 come back as the same value, a float."""
    out = checks.positive_number("learning_rate", good)
    assert out == want and type(out) is float


def test_non_negative_int_accepts_zero_but_not_bool():
    """Zero is a valid count; True/False are ints to Python but not counts, so they are
    refused like any other non-integer."""
    assert checks.non_negative_int("seed", 0) == 0
    assert checks.non_negative_int("seed", np.int64(5)) == 5
    for bad in (True, False, -1, 2.0, "3"):
        with pytest.raises(ValueError, match=r"^seed must be an integer >= 0, got "):
            checks.non_negative_int("seed", bad)
    with pytest.raises(ValueError, match=r"got True$"):
        checks.positive_int("steps", True)


def test_open_unit_interval_excludes_both_ends():
    """A probability strictly between 0 and 1: the ends themselves are refused, naming the
    argument, while values just inside them pass through as floats."""
    for bad in (0.0, 0, 1.0, 1, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"^dropout must be in the open interval \(0, 1\)"):
            checks.open_unit_interval("dropout", bad)
    assert checks.open_unit_interval("dropout", 1e-9) == 1e-9
    assert checks.open_unit_interval("dropout", np.float32(0.25)) == 0.25


def test_unit_interval_includes_both_ends():
    """A share in the closed interval [0, 1]: both ends pass through as floats, while
    values outside it, NaN, bools and strings are refused naming the argument."""
    for good, value in (
        (0, 0.0),
        (1, 1.0),
        (1.0, 1.0),
        (np.float32(0.25), 0.25),
        (np.int64(1), 1.0),
    ):
        assert checks.unit_interval("--residual", good) == value
        assert type(checks.unit_interval("--residual", good)) is float
    for bad in (-0.01, 1.01, float("nan"), True, False, "0.5"):
        with pytest.raises(ValueError) as err:
            checks.unit_interval("--residual", bad)
        assert str(err.value) == f"--residual must be a number in [0, 1], got {bad!r}"


CONFIG = types.SimpleNamespace(num_layers=2, num_heads=3)


@pytest.mark.parametrize("value,low", [(2, 2), (5, 2), (np.int64(3), 3), (0, 0), (-1, -4)])
def test_integer_at_least_accepts_its_lowest_value_and_above(value, low):
    out = checks.integer_at_least("seq_len", value, low)
    assert out == value and type(out) is int


@pytest.mark.parametrize(
    "value,low",
    [(1, 2), (0, 2), (-3, 2), (2.0, 2), ("2", 2), (None, 2), (np.float32(4), 2)]
    + [(True, 0), (False, 0), (True, 1)],  # bools fail even where their value would pass
)
def test_integer_at_least_refuses_smaller_values_bools_and_non_integers(value, low):
    message = f"seq_len must be an integer >= {low}, got {value!r}"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        checks.integer_at_least("seq_len", value, low)


@pytest.mark.parametrize("value", [True, False, 0, -1, 1.0, "3"])
def test_positive_int_refuses_bools_like_integer_at_least(value):
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1"):
        checks.positive_int("num_heads", value)


def test_one_of_returns_the_choice_and_names_the_choices():
    assert checks.one_of("mode", "b", ("a", "b")) == "b"
    with pytest.raises(ValueError, match=r"^mode must be one of \('a', 'b'\), got 'c'$"):
        checks.one_of("mode", "c", ("a", "b"))


@pytest.mark.parametrize("shape", [(2, 3), (4, 2, 3), (1, 2, 3)])
def test_head_mask_takes_one_mask_or_one_per_sequence(shape):
    mask = np.linspace(0.0, 1.0, int(np.prod(shape))).reshape(shape)  # both ends included
    out = checks.head_mask(mask, CONFIG)
    assert out.shape == shape and out.dtype == jnp.result_type(float)
    np.testing.assert_allclose(out, mask, rtol=1e-6)


@pytest.mark.parametrize("shape", [(3, 2), (2,), (2, 3, 3), (2, 2, 3, 1), (3, 2, 3, 2)])
def test_head_mask_of_another_shape_is_named(shape):
    with pytest.raises(ValueError, match=r"head_mask must have shape \(L, H\) = \(2, 3\) or"):
        checks.head_mask(np.ones(shape), CONFIG)


@pytest.mark.parametrize("bad", [-0.01, 1.5, np.nan])
def test_head_mask_entries_outside_zero_to_one_are_named(bad):
    mask = np.ones((2, 3))
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=r"head_mask entries must be in \[0, 1\]"):
        checks.head_mask(mask, CONFIG)
