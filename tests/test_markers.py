"""The suite's marker checks (`helpers.markers`)."""

import jax.numpy as jnp
import numpy as np
import pytest

from helpers.markers import float64_without_marker, is_float64_dtype


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
