"""The shared argument checks: each accepts what its docstring says, refuses the rest in
one ValueError naming the argument, and returns the value in the type it promises."""

import re
import types

import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar.base import checks

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
