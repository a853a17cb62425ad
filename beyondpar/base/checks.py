"""Argument checks shared by the public functions and configs; they run outside jit.

Each raises ValueError naming the argument, what it must be and what it got.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
    """True when values can be inspected (not a tracer inside a user's jit)."""
    return not isinstance(x, jax.core.Tracer)


class MissingPathError(FileNotFoundError, ValueError):
    """A path argument that names no file or folder the call can read. A ValueError like
    every other bad argument (the project's convention), and a FileNotFoundError for code
    that catches those."""


def path_error(path, message: str) -> ValueError:
    """The error for a path argument that is not what the call reads: MissingPathError
    when nothing is there, a plain ValueError when something of the wrong kind is (a
    folder where a file must be, or the reverse)."""
    return ValueError(message) if Path(path).exists() else MissingPathError(message)


_warned_float64 = False


def as_float_array(name: str, x) -> jax.Array:
    """Float array of `x`; integer and bool inputs become the default float dtype.

    float64 input while JAX runs in float32 mode is computed in float32: said once.
    """
    global _warned_float64
    if isinstance(x, (list, tuple)):
        x = jnp.asarray(x)  # Python numbers take JAX's default dtypes: no float64 to warn of
    dtype = getattr(x, "dtype", None)
    if dtype == np.float64 and not jax.config.jax_enable_x64 and not _warned_float64:
        _warned_float64 = True
        warnings.warn(
            f"{name} is float64 but JAX runs in float32 mode, so it is computed in float32; "
            "enable float64 with jax.config.update('jax_enable_x64', True)",
            stacklevel=3,
        )
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        x = jnp.asarray(x, dtype=jnp.result_type(float))
    return jnp.asarray(x)


def square_matrices(name: str, x) -> jax.Array:
    """`x` as a float array of T x T matrices: operators and attention over one set of
    tokens, a row per query over the same tokens as keys."""
    a = as_float_array(name, x)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"{name} must have shape (..., T, T) with square matrices, got {a.shape}")
    return a


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def positive_number(name: str, value) -> float:
    """A finite real number > 0 (a rate or a scale), as a float: Python, NumPy or 0-d JAX
    numbers pass; bools, strings, arrays, NaN and infinity fail."""
    array = np.asarray(value)  # strings and bytes become text arrays, refused below
    real = array.ndim == 0 and array.dtype.kind in "iuf"
    if not (real and np.isfinite(array) and array > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(array)


def open_unit_interval(name: str, value) -> float:
    if not (isinstance(value, (int, float, np.floating)) and 0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be in the open interval (0, 1), got {value!r}")
    return float(value)


def unit_interval(name: str, value) -> float:
    """A number in the closed interval [0, 1] (a share); bools and NaN fail."""
    if isinstance(value, bool) or not (
        isinstance(value, (int, float, np.integer, np.floating)) and 0.0 <= value <= 1.0
    ):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def one_of(name: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def head_mask(mask, config):
    """A head mask as a float array of shape (L, H) or (B, L, H) with entries in [0, 1],
    for a model of `config.num_layers` layers of `config.num_heads` heads: the paper's
    model and every pretrained family take the same masks."""
    values = np.asarray(mask, np.float64)
    want = (config.num_layers, config.num_heads)
    if values.ndim not in (2, 3) or values.shape[-2:] != want:
        raise ValueError(
            f"head_mask must have shape (L, H) = {want} or (B, L, H), got shape {values.shape}"
        )
    if not np.all((values >= 0) & (values <= 1)):
        raise ValueError(
            f"head_mask entries must be in [0, 1], got range [{values.min()}, {values.max()}]"
        )
    return jnp.asarray(mask, jnp.result_type(float))


def integer_at_least(name: str, value, low: int) -> int:
    """An integer >= `low` (a size with a smallest workable value, such as two tokens to
    tell apart), as an int; bools fail, as in `positive_int`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)
