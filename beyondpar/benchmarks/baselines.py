"""The baselines speed is measured against: the paper's own method (explicit matrix powers
for fidelity, Monte Carlo walks for hitting time) and a NumPy loop of this package's
exact algorithm, one matrix at a time."""

from __future__ import annotations

import numpy as np


def numpy_walk_columns(c: np.ndarray) -> np.ndarray:
    """The reference walk in column form, as in `metrics`, for one matrix."""
    cum = np.minimum(1.0, np.cumsum(c, axis=0))
    w = np.diff(cum, axis=0, prepend=0.0)
    w[-1] += 1.0 - cum[-1]
    return w


def paper_fidelity(c: np.ndarray, k: int = 100) -> float:
    """The paper's fidelity: explicit matrix powers, one T^3 product per step."""
    power, best = np.eye(len(c)), np.zeros(len(c))
    for _ in range(k):
        power = power @ c
        best = np.maximum(best, power[-1])
    return best.min()


def paper_method(c: np.ndarray, rng: np.random.Generator, walks: int = 500, k: int = 100):
    """The paper's pipeline for one operator: fidelity from matrix powers, hitting time by
    `walks` Monte Carlo walks per start token drawn from the unnormalised columns."""
    t = c.shape[0]
    walk_rows = numpy_walk_columns(c).T
    cdf = np.cumsum(walk_rows, axis=1)
    total = 0
    for start in range(t - 1):
        for _ in range(walks):
            state, steps = start, 0
            while state != t - 1 and steps < k:
                state = min(int(np.searchsorted(cdf[state], rng.random(), side="right")), t - 1)
                steps += 1
            total += steps
    return paper_fidelity(c, k), total / (walks * t)


def numpy_exact(c: np.ndarray, k: int = 100):
    """The exact algorithm of `metrics`, one matrix at a time in NumPy."""
    t = c.shape[0]
    s = np.zeros(t, c.dtype)
    s[-1] = 1
    survival = np.ones(t, c.dtype)
    survival[-1] = 0
    w = numpy_walk_columns(c)
    best = np.zeros(t, c.dtype)
    hit = survival.sum()
    for step in range(1, k + 1):
        s = s @ c
        best = np.maximum(best, s)
        survival = survival @ w
        survival[-1] = 0
        if step < k:
            hit += survival.sum()
    return best.min(), hit / t
