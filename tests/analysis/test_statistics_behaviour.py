"""The resampling as documented, checked where its answer is known exactly: the circular
block bootstrap of one document against all its equally likely draws, every window as
likely to be drawn as any other, a resample as long as the document, and summaries that
order one document's windows by their positions and fall back to windows one by one
when some record has no document."""

import itertools

import numpy as np
import pytest

from beyondpar.analysis import statistics
from beyondpar.measure import record


def exact_block_distribution(values, length, blocks):
    """The circular block bootstrap's resample means, each with its chance, by brute
    force in float64: every tuple of block starts is equally likely, blocks of `length`
    windows wrap around the end, and the last block is cut to the data's length."""
    windows = len(values)
    exact = {}
    starts = list(itertools.product(range(windows), repeat=blocks))
    for draw in starts:
        taken = [(s + k) % windows for s in draw for k in range(length)][:windows]
        mean = round(float(values[taken].mean()), 12)
        exact[mean] = exact.get(mean, 0.0) + 1 / len(starts)
    return exact


@pytest.mark.parametrize("windows", [4, 5])
def test_one_documents_resamples_follow_every_draw_of_circular_blocks(windows):
    """4 windows: blocks of 2, 2 a resample (16 draws); 5 windows: blocks of 2, 3 a
    resample, the last cut to one window (125 draws). The module's 2,000 resample means
    take only the values the draws give, each about as often (within 4%)."""
    values = np.array([1.0, 2.0, 4.0, 8.0, 16.0])[:windows]
    length = statistics.block_length(windows)
    plan = statistics.resampling(windows, [0] * windows)
    assert (plan.block_length, plan.units) == (2, -(-windows // 2))
    exact = exact_block_distribution(values, length, plan.units)
    means = statistics.resample_means(values, 0, [0] * windows)
    seen = {}
    for m in means.round(12):
        seen[m] = seen.get(m, 0.0) + 1 / len(means)
    assert set(seen) <= set(exact), sorted(set(seen) - set(exact))
    for mean, p in exact.items():
        assert abs(seen.get(mean, 0.0) - p) < 0.04, (mean, seen.get(mean), p)


@pytest.mark.parametrize("windows", [10, 27, 30])
def test_every_window_of_one_document_is_drawn_as_often_as_any_other(windows):
    """Blocks wrap around the document's end, so the first and last windows are drawn as
    often as the middle ones: with one column per window marking it, each window's mean
    share over the resamples is 1 / W (within 15%; a block that could not wrap would
    draw the end windows about a third as often)."""
    marks = np.eye(windows)
    shares = statistics.resample_means(marks, 1, [0] * windows).mean(0)
    np.testing.assert_allclose(shares, 1 / windows, rtol=0.15)
    assert shares.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("windows", [2, 5, 10, 11, 28, 100, 513])
def test_a_resample_of_one_document_holds_as_many_windows_as_the_document(windows):
    """ceil(W / length) blocks: enough for W windows, one fewer would not be, and the
    report's sentence counts them."""
    plan = statistics.resampling(windows, ["doc"] * windows)
    length = plan.block_length
    assert plan.units * length >= windows > (plan.units - 1) * length
    blocks = f"{plan.units} block{'s' * (plan.units != 1)}"
    assert f"draws {blocks} of {length} consecutive window" in plan.text()


def layer_record(values):
    """One window's layer: two heads whose every field is `values`, one mix scoring the
    first value, the scalars and sink mass from them."""
    a, b = (float(v) for v in values)
    graph = {
        "heads": {f: [a, b] for f in record.OPERATOR_FIELDS},
        "mixes": {
            "uniform": {
                **{f: (a + b) / 2 for f in record.OPERATOR_FIELDS},
                "gain": (a + b) / 2 - max(a, b),
            }
        },
        **{name: a * (i + 1) for i, name in enumerate(record.LAYER_SCALARS)},
        "sink_mass": [b, a],
    }
    return {**graph, record.WITHOUT_SINK: {k: v for k, v in graph.items() if k != "sink_mass"}}


def document_records(windows=24, seed=0):
    """Windows of one document in order, values drifting along it (neighbours alike)."""
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(size=(windows, 3)), axis=0)
    return [
        {
            "document": "only",
            "position": w,
            "layers": {"0": layer_record(drift[w, :2])},
            "rollout": {"network_fidelity": float(drift[w, 2]), "first_token_share": 0.5},
        }
        for w in range(windows)
    ]


def leaves(tree, path=()):
    """Every number of a summary by its path, lists flattened."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, (*path, key))
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from leaves(value, (*path, i))
    else:
        yield path, tree


def assert_same_summary(got, want):
    got, want = dict(leaves(got)), dict(leaves(want))
    assert set(got) == set(want)
    for path, value in want.items():
        if isinstance(value, float):
            assert got[path] == pytest.approx(value, rel=1e-12, abs=1e-15), path
        else:
            assert got[path] == value, path


def test_a_documents_windows_are_summarized_in_the_order_of_their_positions():
    """Windows of one document given in any order, with their positions, have the
    summary of the same windows given in order: every interval of the layers and of the
    rollout resamples blocks of windows neighbouring in the document."""
    records = document_records()
    shuffled = [records[i] for i in np.random.default_rng(3).permutation(len(records))]
    want = statistics.summarize(records, seed=2)
    assert_same_summary(statistics.summarize(shuffled, seed=2), want)
    # The order matters: without positions the shuffled windows are other blocks.
    unplaced = [{k: v for k, v in r.items() if k != "position"} for r in shuffled]
    other = statistics.summarize(unplaced, seed=2)
    assert other["rollout"]["network_fidelity"] != want["rollout"]["network_fidelity"]
    assert other["layers"]["0"]["heads"] != want["layers"]["0"]["heads"]


def test_a_record_without_a_position_leaves_the_windows_in_the_order_given():
    """Positions are used only when every record has one."""
    records = document_records(12)
    partly = [dict(r) for r in records[::-1]]
    partly[4].pop("position")
    unplaced = [{k: v for k, v in r.items() if k != "position"} for r in records[::-1]]
    assert_same_summary(statistics.summarize(partly, 1), statistics.summarize(unplaced, 1))


def test_a_record_without_a_document_makes_the_windows_independent():
    """Documents are used only when every record names one; otherwise the windows are
    resampled one by one, and the summary says so."""
    records = document_records(12)
    for i, r in enumerate(records):
        r["document"] = i // 4
    partly = [dict(r) for r in records]
    partly[5].pop("document")
    unknown = [{k: v for k, v in r.items() if k != "document"} for r in records]
    got = statistics.summarize(partly, 4)
    assert got["intervals"]["method"] == statistics.WINDOW
    assert got["intervals"]["documents"] is None
    assert_same_summary(got, statistics.summarize(unknown, 4))
