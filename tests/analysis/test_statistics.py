"""Bootstrap intervals over windows: a 95% interval is the middle 95% of the bootstrap
distribution of the mean, checked where that distribution is known exactly."""

import numpy as np
import pytest
from scipy import stats

from beyondpar.analysis import statistics
from beyondpar.measure import record

FIELDS = record.OPERATOR_FIELDS


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
    heads = {f: [float(x) for x in head_fidelity] for f in FIELDS}
    mix = {f: float(max(head_fidelity) + gain) for f in FIELDS}
    layer = {
        "heads": heads,
        "mixes": {"uniform": {**mix, "gain": float(gain)}},
        "best_head_fidelity": float(max(head_fidelity)),
        "head_diversity": 0.5,
        "cross_head_share_minimax": 0.25,
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


def reference_interval(values, seed):
    """One bootstrap call on one block of values, as each interval was once computed."""
    x = np.asarray(values, np.float64)
    mean = x.mean(0).tolist()
    if len(x) < 2 or np.all(x == x[:1]):
        return {"mean": mean, "low": mean, "high": mean}
    ci = stats.bootstrap(
        (x,),
        np.mean,
        axis=0,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(seed),
    ).confidence_interval
    return {"mean": mean, "low": np.asarray(ci.low).tolist(), "high": np.asarray(ci.high).tolist()}


# A constant whose bootstrap interval is not itself: the percentile between two equal
# resampled means rounds 0.33 to 0.33000000000000007 (40 windows, seed 0).
CONSTANT = 0.33


def random_graph(rng, heads, constant_head_field):
    """One window's graph with ties (values on a grid of 1/20), a constant head field, a
    constant head within a varying field, a constant mix field and a constant scalar."""
    graph = {"heads": {f: (rng.integers(0, 20, heads) / 20).tolist() for f in FIELDS}}
    graph["heads"][constant_head_field] = [CONSTANT] * heads
    graph["heads"]["hitting_time_reference"][0] = CONSTANT
    graph["mixes"] = {
        mix: {f: float(rng.integers(0, 20) / 20) for f in record.MIX_FIELDS}
        for mix in ("learned", "uniform")
    }
    graph["mixes"]["uniform"]["fidelity_p10"] = CONSTANT
    graph.update(
        best_head_fidelity=float(rng.random()),
        head_diversity=CONSTANT,
        cross_head_share_minimax=float(rng.random()),
        cross_head_share_mean=float(rng.random()),
    )
    return graph


def random_records(windows, layers=3, heads=3, without_sink=True, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(windows):
        layer = {}
        for i in range(layers):
            layer[str(i)] = random_graph(rng, heads, "fidelity_p10")
            layer[str(i)]["sink_mass"] = rng.random(heads).tolist()
            if without_sink:
                layer[str(i)]["without_sink"] = random_graph(rng, heads, "fidelity_median")
        rollout = {"network_fidelity": float(rng.random()), "first_token_share": CONSTANT}
        records.append({"layers": layer, "rollout": rollout})
    return records


def reference_graph(rows, seed):
    """A graph's summary from one bootstrap call per head field (W x H) and per scalar."""

    def scalar(values):
        return {k: v[0] for k, v in reference_interval(np.c_[values], seed).items()}

    mixes = {
        mix: {f: scalar([r["mixes"][mix][f] for r in rows]) for f in record.MIX_FIELDS}
        for mix in rows[0]["mixes"]
    }
    for mix, stat in mixes.items():
        stat["wins_share"] = float(np.mean([r["mixes"][mix]["gain"] > 0 for r in rows]))
    fidelity = np.mean([r["heads"]["fidelity"] for r in rows], axis=0)
    return {
        "heads": {
            f: reference_interval([r["heads"][f] for r in rows], seed)
            for f in record.OPERATOR_FIELDS
        },
        "mixes": mixes,
        "best_head": int(np.argmax(fidelity)),
        **{
            name: scalar([r[name] for r in rows])
            for name in (
                "best_head_fidelity",
                "head_diversity",
                "cross_head_share_minimax",
                "cross_head_share_mean",
            )
        },
    }


@pytest.mark.parametrize("without_sink", [True, False])
@pytest.mark.parametrize("seed", [0, 3])
def test_the_summary_is_one_bootstrap_call_per_block_float_for_float(without_sink, seed):
    """40 windows: enough for np.mean to sum a lone column's resample pairwise and a head
    field's one window after another, so a block summed the other way differs in the
    last bits; `==` on every float."""
    records = random_records(40, without_sink=without_sink, seed=seed)
    expected = {}
    for name in records[0]["layers"]:
        rows = [r["layers"][name] for r in records]
        expected[name] = reference_graph(rows, seed)
        expected[name]["sink_mass"] = reference_interval([r["sink_mass"] for r in rows], seed)
        if without_sink:
            expected[name]["without_sink"] = reference_graph(
                [r["without_sink"] for r in rows], seed
            )
    roll = reference_interval(
        [[r["rollout"]["network_fidelity"], r["rollout"]["first_token_share"]] for r in records],
        seed,
    )
    summary = statistics.summarize(records, seed)
    assert summary["layers"] == expected
    assert summary["rollout"] == {
        name: {k: v[i] for k, v in roll.items()}
        for i, name in enumerate(("network_fidelity", "first_token_share"))
    }
    layer = summary["layers"]["0"]
    assert layer["head_diversity"]["low"] == layer["head_diversity"]["mean"]
    constant = layer["mixes"]["uniform"]["fidelity_p10"]
    assert constant["low"] == constant["mean"] == constant["high"]


def test_a_constant_column_keeps_its_mean_and_leaves_the_others_alone():
    rng = np.random.default_rng(7)
    varying = {"a": rng.random(40), "b": rng.random((40, 3)), "c": rng.random((40, 1))}
    alone = statistics.intervals(varying, seed=0)
    together = statistics.intervals({**varying, "constant": np.full(40, CONSTANT)}, seed=0)
    assert together["constant"] == {"mean": CONSTANT, "low": CONSTANT, "high": CONSTANT}
    for key, x in varying.items():
        assert together[key] == alone[key] == reference_interval(x, seed=0), key
    # Bootstrapped, the constant would move to a neighbouring float.
    ci = stats.bootstrap(
        (np.full(40, CONSTANT),),
        np.mean,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    assert ci.confidence_interval.low != CONSTANT


def test_one_window_gives_its_values_as_mean_low_and_high():
    summary = statistics.summarize(random_records(1, layers=2), seed=0)

    def check(tree):
        if set(tree) == {"mean", "low", "high"}:
            assert tree["low"] == tree["mean"] == tree["high"]
        else:
            for value in tree.values():
                if isinstance(value, dict):
                    check(value)

    check(summary)
    record = random_records(1, layers=2)[0]["layers"]["1"]
    assert summary["layers"]["1"]["heads"]["fidelity"]["low"] == record["heads"]["fidelity"]
    best = summary["layers"]["1"]["without_sink"]["best_head_fidelity"]
    assert best["high"] == record["without_sink"]["best_head_fidelity"]


def test_one_window_with_an_undefined_value_keeps_it_as_mean_low_and_high():
    # NaN equals nothing, not even itself, yet a single window has nothing to resample.
    stat = statistics.intervals({"a": [float("nan")], "b": [[1.0, float("nan")]]}, seed=0)
    assert np.isnan([stat["a"][k] for k in ("mean", "low", "high")]).all()
    for k in ("mean", "low", "high"):
        assert stat["b"][k][0] == 1.0 and np.isnan(stat["b"][k][1]), (k, stat["b"])


def test_each_columns_interval_is_its_means_normal_interval():
    """Columns of standard deviations 1 to 1,000 side by side, single and in a block: the
    mean's bootstrap distribution is about normal with deviation s / sqrt(W), so the 95%
    interval is the mean +- 1.96 s / sqrt(W) to within 15% (2,000 resamples): for the same
    spread, 4 times narrower for 400 windows than for 25."""
    scales = np.array([1.0, 10.0, 100.0, 1000.0])
    widths = {}
    for windows in (25, 400):
        x = np.random.default_rng(windows).normal(size=(windows, 4)) * scales
        blocks = {"lone": x[:, 0], "wide": x[:, 1:3], "last": x[:, 3:]}
        stat = statistics.intervals(blocks, seed=1)
        low = np.hstack([stat[key]["low"] for key in blocks])
        high = np.hstack([stat[key]["high"] for key in blocks])
        mean, half = x.mean(0), 1.96 * x.std(0) / np.sqrt(windows)
        np.testing.assert_allclose(mean - low, half, rtol=0.15)
        np.testing.assert_allclose(high - mean, half, rtol=0.15)
        widths[windows] = (high - low) / x.std(0)
    np.testing.assert_allclose(widths[25] / widths[400], 4.0, rtol=0.2)


def test_intervals_of_any_block_shape_are_one_call_each_and_windows_must_agree():
    """A block of one value per window in any shape (W, W x 1, W x 1 x 5 with five
    columns) gets the interval of its own bootstrap call; blocks over different numbers
    of windows are refused, naming each block's count."""
    rng = np.random.default_rng(4)
    blocks = {"a": rng.random(30), "b": rng.random((30, 1)), "c": rng.random((30, 1, 5))}
    got = statistics.intervals(blocks, 2)
    for key, x in blocks.items():
        alone = stats.bootstrap(
            (x.reshape(30, -1),),
            np.mean,
            axis=0,
            n_resamples=statistics.N_RESAMPLES,
            method="percentile",
            rng=np.random.default_rng(2),
        ).confidence_interval
        assert np.ravel(got[key]["low"]).tolist() == np.ravel(alone.low).tolist()
        assert np.ravel(got[key]["high"]).tolist() == np.ravel(alone.high).tolist()
    with pytest.raises(
        ValueError, match=r"one value per window each, got windows \{'a': 30, 'd': 29\}"
    ):
        statistics.intervals({"a": blocks["a"], "d": rng.random(29)}, 0)
