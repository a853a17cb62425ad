"""Devices and meshes: one 1-D `data` mesh over every device of every process."""

from __future__ import annotations

import os

import jax


def use_all_cpu_cores() -> int:
    """Expose one CPU device per core, so data-parallel code also spreads over CPU cores.

    Must run before JAX creates its backends (first array or device query); entry points
    call it at start. Returns the number of CPU devices asked for.
    """
    count = os.cpu_count() or 1
    jax.config.update("jax_num_cpu_devices", count)
    return count
