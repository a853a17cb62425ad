"""Bootstrap intervals over windows: a 95% interval is the middle 95% of the bootstrap
distribution of the mean, checked where that distribution is known exactly."""

import numpy as np
import pytest
from scipy import stats

from beyondpar.analysis import statistics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_95_percent_interval_is_the_bootstrap_distributions_middle_95_percent(seed):
    """0/1 data with 120 ones in 400: resampling draws Binomial(400, 0.3) ones, so the
    mean's bootstrap distribution is Binomial(400, 0.3) / 400 exactly, and a 95%
    percentile interval is its 2.5% and 97.5% quantiles (steps of 1/400). A 90% or 99%
    interval lies 3 or 6 steps inside or outside; 2,000 resamples put the ends within
    1.5 steps."""
    x = np.zeros((400, 1))
    x[np.random.default_rng(seed).permutation(400)[:120]] = 1.0
    stat = statistics.interval(x, seed=seed)
    low, high = (stats.binom.ppf(q, 400, 0.3) / 400 for q in (0.025, 0.975))
    assert abs(stat["low"][0] - low) <= 1.5 / 400, (stat, low)
    assert abs(stat["high"][0] - high) <= 1.5 / 400, (stat, high)
    assert stat["mean"][0] == pytest.approx(0.3)


def test_interval_is_around_the_mean_and_degenerate_without_spread():
    x = np.arange(20.0)[:, None] * np.array([1.0, 2.0])
    stat = statistics.interval(x, seed=1)
    np.testing.assert_allclose(stat["mean"], [9.5, 19.0])
    assert all(
        lo < m < hi for lo, m, hi in zip(stat["low"], stat["mean"], stat["high"], strict=True)
    )
    same = statistics.interval(np.ones((5, 1)), seed=0)
    assert same == {"mean": [1.0], "low": [1.0], "high": [1.0]}
