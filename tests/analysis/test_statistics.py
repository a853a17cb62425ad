"""Bootstrap intervals over windows: a 95% interval is the middle 95% of the bootstrap
distribution of the mean, checked where that distribution is known exactly; windows of
one document are resampled together (documents), or in blocks of consecutive windows
when there is one document, and the summary says which."""

import itertools

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


def reference_interval(values, seed, documents=None):
    """The interval of one block of values alone, in a call of its own."""
    return statistics.interval(values, seed, documents)


def assert_same_intervals(got, want):
    """Summaries or intervals alike: means float for float, the ends to rounding (a
    column's resample means are sums whose order depends on its neighbours)."""
    if isinstance(want, dict) and set(want) == {"mean", "low", "high"}:
        assert got["mean"] == want["mean"]
        for end in ("low", "high"):
            np.testing.assert_allclose(got[end], want[end], rtol=1e-12, atol=0)
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            assert_same_intervals(got[key], want[key])
    else:
        assert got == want


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


def random_records(windows, layers=3, heads=3, without_sink=True, seed=0, per_document=8):
    """Random window records, `per_document` consecutive windows of each document."""
    rng = np.random.default_rng(seed)
    records = []
    for w in range(windows):
        layer = {}
        for i in range(layers):
            layer[str(i)] = random_graph(rng, heads, "fidelity_p10")
            layer[str(i)]["sink_mass"] = rng.random(heads).tolist()
            if without_sink:
                layer[str(i)]["without_sink"] = random_graph(rng, heads, "fidelity_median")
        rollout = {"network_fidelity": float(rng.random()), "first_token_share": CONSTANT}
        place = {"document": w // per_document, "position": w % per_document}
        records.append({**place, "layers": layer, "rollout": rollout})
    return records


def reference_graph(rows, seed, documents):
    """A graph's summary from one bootstrap call per head field (W x H) and per scalar."""

    def scalar(values):
        return reference_interval(values, seed, documents)

    mixes = {
        mix: {f: scalar([r["mixes"][mix][f] for r in rows]) for f in record.MIX_FIELDS}
        for mix in rows[0]["mixes"]
    }
    for mix, stat in mixes.items():
        stat["wins_share"] = float(np.mean([r["mixes"][mix]["gain"] > 0 for r in rows]))
    fidelity = np.mean([r["heads"]["fidelity"] for r in rows], axis=0)
    return {
        "heads": {
            f: reference_interval([r["heads"][f] for r in rows], seed, documents)
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
def test_the_summary_is_one_bootstrap_of_the_documents_per_block(without_sink, seed):
    """40 windows of 5 documents: every block of the summary has the interval it has in
    a call of its own over the same documents (means `==`, ends to rounding), constant
    columns keep their mean, and the summary says how it resampled."""
    records = random_records(40, without_sink=without_sink, seed=seed)
    documents = [r["document"] for r in records]
    expected = {}
    for name in records[0]["layers"]:
        rows = [r["layers"][name] for r in records]
        expected[name] = reference_graph(rows, seed, documents)
        expected[name]["sink_mass"] = reference_interval(
            [r["sink_mass"] for r in rows], seed, documents
        )
        if without_sink:
            expected[name]["without_sink"] = reference_graph(
                [r["without_sink"] for r in rows], seed, documents
            )
    roll = reference_interval(
        [[r["rollout"]["network_fidelity"], r["rollout"]["first_token_share"]] for r in records],
        seed,
        documents,
    )
    summary = statistics.summarize(records, seed)
    assert_same_intervals(summary["layers"], expected)
    assert_same_intervals(
        summary["rollout"],
        {
            name: {k: v[i] for k, v in roll.items()}
            for i, name in enumerate(("network_fidelity", "first_token_share"))
        },
    )
    layer = summary["layers"]["0"]
    assert layer["head_diversity"]["low"] == layer["head_diversity"]["mean"]
    constant = layer["mixes"]["uniform"]["fidelity_p10"]
    assert constant["low"] == constant["mean"] == constant["high"]
    hitting = layer["heads"]["hitting_time_reference"]  # head 0 constant, the others not
    assert hitting["low"][0] == hitting["high"][0] == CONSTANT != hitting["low"][1]
    assert summary["intervals"]["method"] == statistics.CLUSTER
    assert (summary["intervals"]["units"], summary["intervals"]["windows"]) == (5, 40)


def test_a_constant_column_keeps_its_mean_and_leaves_the_others_alone():
    rng = np.random.default_rng(7)
    varying = {"a": rng.random(40), "b": rng.random((40, 3)), "c": rng.random((40, 1))}
    documents = np.arange(40) // 4
    alone = statistics.intervals(varying, 0, documents)
    together = statistics.intervals({**varying, "constant": np.full(40, CONSTANT)}, 0, documents)
    assert together["constant"] == {"mean": CONSTANT, "low": CONSTANT, "high": CONSTANT}
    for key, x in varying.items():
        assert_same_intervals(together[key], alone[key])
        assert_same_intervals(alone[key], reference_interval(x, 0, documents))
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
    columns) gets the interval of its own call, shaped as the block; blocks over
    different numbers of windows are refused, naming each block's count."""
    rng = np.random.default_rng(4)
    blocks = {"a": rng.random(30), "b": rng.random((30, 1)), "c": rng.random((30, 1, 5))}
    documents = np.arange(30) % 7
    got = statistics.intervals(blocks, 2, documents)
    for key, x in blocks.items():
        alone = statistics.interval(x, 2, documents)
        assert_same_intervals(got[key], alone)
        assert np.shape(got[key]["low"]) == x.shape[1:]
    with pytest.raises(
        ValueError, match=r"one value per window each, got windows \{'a': 30, 'd': 29\}"
    ):
        statistics.intervals({"a": blocks["a"], "d": rng.random(29)}, 0)


def clustered(documents=8, per_document=10, seed=0):
    """Windows alike within a document (noise 0.01) and documents apart (spread 1): the
    values and each window's document."""
    rng = np.random.default_rng(seed)
    level = rng.normal(size=documents)
    values = np.repeat(level, per_document) + 0.01 * rng.normal(size=documents * per_document)
    return values, np.repeat(np.arange(documents), per_document)


def test_documents_of_alike_windows_widen_the_interval_to_their_own_spread():
    """8 documents of 10 alike windows are 8 observations, not 80: the interval is the
    mean +- 1.96 sd(document means) / sqrt(8) (to 25%, 8 documents make a coarse
    distribution), about sqrt(10) times the window bootstrap's, which is too narrow."""
    values, documents = clustered()
    stat = statistics.cluster_interval(values, documents, seed=0)
    windows = statistics.interval(values, seed=0)
    spread = np.array([values[documents == d].mean() for d in range(8)]).std()
    half = 1.96 * spread / np.sqrt(8)
    assert stat["high"] - stat["low"] == pytest.approx(2 * half, rel=0.25)
    assert stat["low"] < stat["mean"] < stat["high"]
    assert stat["mean"] == windows["mean"] == values.mean()
    ratio = (stat["high"] - stat["low"]) / (windows["high"] - windows["low"])
    assert 2.5 < ratio < 4.0, ratio
    assert (stat["method"], stat["unit"], stat["units"]) == (statistics.CLUSTER, "documents", 8)
    assert stat["text"].startswith("cluster bootstrap over 8 documents (80 windows)")
    assert "these documents only" in stat["text"]


def test_many_documents_are_not_said_to_describe_only_themselves():
    values, documents = clustered(documents=statistics.FEW_DOCUMENTS, per_document=2)
    text = statistics.cluster_interval(values, documents, seed=0)["text"]
    assert text.startswith("cluster bootstrap over 10 documents (20 windows)")
    assert "only" not in text


def ar1(windows, phi, seed):
    """A series of one document whose neighbouring windows are alike (AR(1), phi)."""
    rng = np.random.default_rng(seed)
    x = np.zeros(windows)
    for t in range(1, windows):
        x[t] = phi * x[t - 1] + rng.normal()
    return x


def test_one_document_is_resampled_in_blocks_of_consecutive_windows():
    """One document of 512 windows whose neighbours are alike (AR(1), phi 0.9): blocks of
    ceil(512^(1/3)) = 8 windows, 64 a resample, in the windows' order by position, give
    an interval at least twice the window bootstrap's (the true ratio is sqrt(19) for
    long blocks; blocks of 8 keep part of it)."""
    x = ar1(512, 0.9, seed=1)
    plan = statistics.resampling(512, [0] * 512)
    assert (plan.method, plan.unit, plan.units, plan.block_length) == (
        statistics.BLOCK,
        "blocks",
        64,
        8,
    )
    stat = statistics.cluster_interval(x, ["only"] * 512, seed=0)
    windows = statistics.interval(x, seed=0)
    assert stat["method"] == statistics.BLOCK and stat["units"] == 64
    assert (stat["high"] - stat["low"]) > 2 * (windows["high"] - windows["low"])
    assert stat["low"] < stat["mean"] < stat["high"] and stat["mean"] == x.mean()
    assert "draws 64 blocks of 8 consecutive windows" in stat["text"]
    assert "describe this document only" in stat["text"]
    # The blocks follow the positions, not the order the windows are given in.
    shuffled = np.random.default_rng(2).permutation(512)
    again = statistics.cluster_interval(x[shuffled], [0] * 512, 0, positions_W=shuffled)
    assert again["low"] == stat["low"] and again["high"] == stat["high"]
    assert again["mean"] == pytest.approx(stat["mean"], rel=1e-12)


@pytest.mark.parametrize(
    ("windows", "length"), [(2, 1), (3, 1), (4, 2), (8, 2), (9, 3), (27, 3), (28, 4), (32, 4)]
)
def test_block_length_is_the_cube_root_rounded_up_and_at_most_half(windows, length):
    assert statistics.block_length(windows) == length


def test_a_summary_of_one_document_says_it_used_blocks():
    records = random_records(32, layers=1, per_document=32)
    summary = statistics.summarize(records, seed=0)["intervals"]
    assert (summary["method"], summary["units"], summary["block_length"]) == (
        statistics.BLOCK,
        8,
        4,
    )
    assert (summary["windows"], summary["documents"], summary["resamples"]) == (32, 1, 2000)
    assert summary["confidence"] == 0.95
    assert summary["text"].startswith("circular block bootstrap over the 32 windows of 1 document")


def test_records_without_documents_are_resampled_window_by_window_and_say_so():
    records = [{k: v for k, v in r.items() if k != "document"} for r in random_records(8)]
    summary = statistics.summarize(records, seed=0)["intervals"]
    assert summary["method"] == statistics.WINDOW and summary["documents"] is None
    assert "treated as independent" in summary["text"]


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    values, documents = clustered(documents=12, per_document=3, seed=5)
    first = statistics.cluster_interval(values, documents, seed=3)
    assert statistics.cluster_interval(values, documents, seed=3) == first
    other = statistics.cluster_interval(values, documents, seed=4)
    assert other["mean"] == first["mean"] and other["low"] != first["low"]
    x = ar1(40, 0.5, seed=0)
    assert statistics.cluster_interval(x, [0] * 40, 9) == statistics.cluster_interval(
        x, [0] * 40, 9
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_interval_contains_the_mean(seed):
    rng = np.random.default_rng(seed)
    values = rng.gamma(1.0, size=(60, 3))  # skewed, several columns
    documents = rng.integers(0, 6, 60)
    stat = statistics.interval(values, seed, documents)
    assert np.all(np.array(stat["low"]) <= stat["mean"])
    assert np.all(np.array(stat["mean"]) <= stat["high"])


def test_a_cluster_bootstrap_of_three_documents_matches_all_27_resamples():
    """Documents of 1, 2 and 3 windows: the 27 equally likely draws of three documents
    give the exact distribution of the resample mean (all windows of the drawn documents,
    each window weighed once, as the point estimate does), computed here in float64 by
    brute force. The module's 2,000 resample means follow it (every value's frequency
    within 4%), and its 95% limits are that distribution's 2.5% and 97.5% points."""
    values = np.array([0.5, 1.0, 2.0, 4.0, 3.0, 5.0])
    documents = np.array([7, 4, 4, 9, 9, 9])  # ids need not be 0, 1, 2 nor sorted
    owned = [values[documents == d] for d in (7, 4, 9)]
    exact = {}
    for draw in itertools.product(range(3), repeat=3):
        mean = np.concatenate([owned[d] for d in draw]).mean()
        exact[round(mean, 12)] = exact.get(round(mean, 12), 0) + 1 / 27
    means = statistics.resample_means(values, 0, documents)
    assert means.shape == (statistics.N_RESAMPLES,)
    seen = {}
    for m in means.round(12):
        seen[m] = seen.get(m, 0) + 1 / len(means)
    assert set(seen) <= set(exact)
    for mean, p in exact.items():
        assert abs(seen.get(mean, 0) - p) < 0.04, (mean, seen.get(mean), p)
    levels = np.array(sorted(exact))
    cdf = np.cumsum([exact[v] for v in levels])
    low = levels[np.searchsorted(cdf, 0.025)]
    high = levels[np.searchsorted(cdf, 0.975)]
    stat = statistics.interval(values, 0, documents)
    assert stat["low"] == pytest.approx(low, abs=1e-12)
    assert stat["high"] == pytest.approx(high, abs=1e-12)
    assert stat["mean"] == values.mean()


def test_two_documents_give_an_interval_from_one_documents_mean_to_the_others():
    """A resample of two documents holds one twice (chance 1/4 each) or both (1/2): its
    mean is one document's, the other's or the overall mean, so the 95% interval runs
    from one document's mean to the other's, whatever the spread of their windows."""
    values = np.array([1.0, 9.0, 2.0, 4.0, 6.0, 8.0, 100.0])
    documents = np.array([0, 0, 1, 1, 1, 1, 1])
    stat = statistics.cluster_interval(values, documents, seed=0)
    assert stat["low"] == pytest.approx(5.0, abs=1e-12)
    assert stat["high"] == pytest.approx(24.0, abs=1e-12)
    assert stat["mean"] == values.mean()
