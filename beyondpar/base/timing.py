"""Wall time, measured the one way every benchmark and analysis reports it: work that JAX
dispatches asynchronously is waited for before the clock stops."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import jax


class Timer:
    """Wall time per named part, summed over calls."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed


def timed(fn: Callable[[], object]):
    """(fn(), seconds), the result's device work included."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of `repeats` calls after one warm-up (compile) call."""
    timed(fn)
    return min(timed(fn)[1] for _ in range(repeats))
