"""Timers: parts summed over calls, and the best time after a warm-up."""

from __future__ import annotations

import time
import types

import jax.numpy as jnp
import pytest

from beyondpar.base import timing


def test_timer_sums_a_part_over_calls():
    """A part entered several times reports the total of its calls, not the last one."""
    timer = timing.Timer()
    for _ in range(3):
        with timer.part("sleep"):
            time.sleep(0.02)
    with timer.part("other"):
        pass
    assert set(timer.seconds) == {"sleep", "other"}
    assert timer.seconds["sleep"] >= 0.06
    assert 0.0 <= timer.seconds["other"] < timer.seconds["sleep"]


def test_best_time_is_the_fastest_call_after_a_warm_up(monkeypatch):
    """The warm-up call is not timed; of the timed calls the fastest is reported."""
    clock = [0.0]
    durations = iter([5.0, 0.3, 0.1, 0.2])  # warm-up (compile), then three timed calls

    def fn():
        clock[0] += next(durations)
        return jnp.zeros(())

    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    assert timing.best_time(fn, 3) == pytest.approx(0.1)
