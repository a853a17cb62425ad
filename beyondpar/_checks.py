"""Argument checks shared by the public functions; they run outside jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
    """True when values can be inspected (not a tracer inside a user's jit)."""
    return not isinstance(x, jax.core.Tracer)


def as_float_array(name: str, x) -> jax.Array:
    """Float array of `x`; integer and bool inputs become the default float dtype."""
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    dtype = getattr(x, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        x = jnp.asarray(x, dtype=jnp.result_type(float))
    return jnp.asarray(x)


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def open_unit_interval(name: str, value) -> float:
    if not (isinstance(value, (int, float, np.floating)) and 0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be in the open interval (0, 1), got {value!r}")
    return float(value)


def one_of(name: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value
