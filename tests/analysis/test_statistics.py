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


def test_two_windows_give_the_percentile_interval_of_their_resampled_means():
    """Resampled means of two windows a, b are a, (a + b) / 2 and b with chances 1/4, 1/2,
    1/4: the 2.5% and 97.5% percentiles are a and b themselves."""
    stat = statistics.interval([[0.0], [1.0]], seed=0)
    assert stat["mean"] == [0.5] and stat["low"] == [0.0] and stat["high"] == [1.0]


def window(head_fidelity, gain, network_fidelity=0.1, first_token_share=0.9):
    """One window's record of one layer: every field of each head is its fidelity, and the
    uniform mix scores its best head plus `gain`."""
    heads = {f: [float(x) for x in head_fidelity] for f in statistics.FIELDS}
    mix = {f: float(max(head_fidelity) + gain) for f in statistics.FIELDS}
    layer = {
        "heads": heads,
        "mixes": {"uniform": {**mix, "gain": float(gain)}},
        "best_head_fidelity": float(max(head_fidelity)),
        "head_diversity": 0.5,
        "cross_head_share_mean": 0.5,
        "sink_mass": [0.5] * len(head_fidelity),
    }
    rollout = {"network_fidelity": network_fidelity, "first_token_share": first_token_share}
    return {"layers": {"0": layer}, "rollout": rollout}


def test_a_mix_wins_a_window_only_when_it_beats_its_best_head():
    # A tie (gain 0, e.g. a mix that is its best head) is no win.
    records = [window([0.2, 0.3], gain) for gain in (0.0, 0.1, -0.1, 0.0)]
    mix = statistics.summarize(records)["layers"]["0"]["mixes"]["uniform"]
    assert mix["wins_share"] == 0.25
    assert mix["gain"]["mean"] == pytest.approx(0.0)


def test_the_best_head_has_the_highest_mean_fidelity_over_windows():
    # Three windows, two heads: head 1 is best on average, though not on every window.
    records = [window(f, 0.0) for f in ([0.5, 0.1], [0.0, 0.4], [0.1, 0.4])]
    layer = statistics.summarize(records)["layers"]["0"]
    assert layer["best_head"] == 1
    np.testing.assert_allclose(layer["heads"]["fidelity"]["mean"], [0.2, 0.3])


def test_the_rollout_numbers_keep_their_names():
    records = [window([0.2], 0.0, 0.01 * i, 0.9 + 0.01 * i) for i in range(3)]
    rollout = statistics.summarize(records)["rollout"]
    assert rollout["network_fidelity"]["mean"] == pytest.approx(0.01)
    assert rollout["first_token_share"]["mean"] == pytest.approx(0.91)
    assert rollout["network_fidelity"]["high"] <= 0.02 < 0.9 <= rollout["first_token_share"]["low"]
