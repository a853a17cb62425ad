"""The suite's marker checks (`helpers.markers`)."""

import jax.numpy as jnp
import numpy as np
import pytest

from helpers.markers import (
    float64_without_marker,
    is_float64_dtype,
    refuse_float64_without_marker,
)


class FakeItem:
    def __init__(self, nodeid, params, marked):
        self.nodeid, self.marked = nodeid, marked
        self.callspec = type("CallSpec", (), {"params": params})()

    def get_closest_marker(self, name):
        return object() if self.marked and name == "float64" else None


@pytest.mark.float64  # its float64 parameters are data here, but the guard sees them too
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float64, True),
        (jnp.float64, True),
        (np.dtype("float64"), True),
        (np.float32, False),
        (jnp.bfloat16, False),
        ("float64", False),  # a string parameter is data
        ("d", False),
        (np.floating, False),  # abstract scalar classes: NumPy refuses them as dtypes
        (np.generic, False),
        (64, False),
        (None, False),
    ],
)
def test_float64_dtypes_are_told_from_other_parameters(value, expected):
    assert is_float64_dtype(value) is expected


def test_only_unmarked_float64_parameters_are_named():
    items = [
        FakeItem("a[float64]", {"dtype": np.float64, "n": 3}, marked=False),
        FakeItem("b[float64]", {"dtype": jnp.float64}, marked=True),
        FakeItem("c[float32]", {"dtype": np.float32}, marked=False),
        FakeItem("d[walk]", {"walk": "reference"}, marked=False),
    ]
    assert float64_without_marker(items) == ["a[float64]"]


def test_collection_stops_on_any_unmarked_item_naming_it():
    """Checked over every item, the first included; a marked or float32 run goes on."""
    first = FakeItem("first[float64]", {"dtype": np.float64}, marked=False)
    fine = [FakeItem("b", {"dtype": np.float32}, marked=False)]
    with pytest.raises(pytest.UsageError, match=r"float64 marker.*'first\[float64\]'"):
        refuse_float64_without_marker([first, *fine])
    assert refuse_float64_without_marker(fine) is None
