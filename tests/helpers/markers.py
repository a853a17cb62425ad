"""Collection checks on the suite's markers."""

import numpy as np
import pytest


def is_float64_dtype(value) -> bool:
    """Whether `value` is the float64 dtype or scalar type (np.float64, jnp.float64, ...);
    strings are test data, not dtypes."""
    if not isinstance(value, type | np.dtype):
        return False
    try:
        return np.dtype(value) == np.float64
    except (TypeError, ValueError):
        return False


def float64_without_marker(items) -> list[str]:
    """The ids of `items` given a float64 dtype parameter but not marked `float64`: x64 is
    off outside marked tests, so such a test would run in float32 (with a warning) and
    test float32 twice while its id says float64."""
    unmarked = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.get_closest_marker("float64") is None and any(
            is_float64_dtype(v) for v in params.values()
        ):
            unmarked.append(item.nodeid)
    return unmarked


def refuse_float64_without_marker(items) -> None:
    """Stop the collection of `items` when any would run float64 parameters in float32."""
    unmarked = float64_without_marker(items)
    if unmarked:
        raise pytest.UsageError(
            f"float64 parameters need the float64 marker (x64 is off without it): {unmarked}"
        )
