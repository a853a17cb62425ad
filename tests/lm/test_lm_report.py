"""The language study's report from fabricated runs: its table numbers are the means,
intervals and seed-paired differences recomputed here by brute force in float64, its
answers follow the numbers (and flip when they flip), and it says the parameters match."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from beyondpar.study import lm_report, lm_stats
from helpers.lm_runs import HEADS, LAYERS, SEEDS, STEPS, bpb, wins, write_runs


def brute_interval(values):
    v = [float(x) for x in values]
    n = len(v)
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def test_loss_cells_and_paired_differences_are_brute_force_recomputations(tmp_path):
    runs = write_runs(tmp_path)
    summary = lm_stats.summarize(runs)
    last = STEPS[-1]
    for h in HEADS:
        want = brute_interval([bpb(h, s, last, -1) for s in SEEDS])
        got = summary["cells"]["eval/bits_per_byte"][h]
        np.testing.assert_allclose([got["mean"], got["low"], got["high"]], want, rtol=1e-12)
        if h == 1:
            continue
        diffs = [bpb(h, s, last, -1) - bpb(1, s, last, -1) for s in SEEDS]
        want = brute_interval(diffs)
        got = summary["paired"]["eval/bits_per_byte"][h]
        np.testing.assert_allclose([got["mean"], got["low"], got["high"]], want, rtol=1e-9)


def test_report_rows_print_the_recomputed_numbers(tmp_path):
    runs = write_runs(tmp_path)
    text = lm_report.markdown(runs)
    last = STEPS[-1]
    for h in HEADS[1:]:
        mean, low, high = brute_interval([bpb(h, s, last, -1) - bpb(1, s, last, -1) for s in SEEDS])
        assert f"{mean:.4f} [{low:.4f}, {high:.4f}]" in text
        mean, low, high = brute_interval([bpb(h, s, last, -1) for s in SEEDS])
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {h} | 3 |"))
        assert f"{mean:.4f} [{low:.4f}, {high:.4f}]" in row
    best = brute_interval([np.mean([0.01 + 0.001 * 4 + 0.0001 * s] * LAYERS) for s in SEEDS])
    assert f"{100 * best[0]:.3f} [{100 * best[1]:.3f}, {100 * best[2]:.3f}]" in text


def test_graph_measures_are_layer_means_of_the_last_evaluation(tmp_path):
    runs = write_runs(tmp_path)
    cells = lm_stats.summarize(runs)["cells"]["wins_optimal"]
    want = brute_interval([np.mean(wins(4, s, STEPS[-1], 1)) for s in SEEDS])
    got = cells[4]
    np.testing.assert_allclose([got["mean"], got["low"], got["high"]], want, rtol=1e-9)


@pytest.mark.parametrize(("loss_sign", "word"), [(-1, "Yes:"), (1, "No:")])
def test_the_loss_answer_flips_with_the_numbers(tmp_path, loss_sign, word):
    runs = write_runs(tmp_path, loss_sign=loss_sign)
    answer = lm_report.loss_answer(lm_stats.summarize(runs))
    assert answer.startswith(lm_report.LOSS_QUESTION + " " + word), answer


def test_the_loss_answer_says_when_nothing_differs(tmp_path):
    runs = write_runs(tmp_path, loss_sign=0)
    for run in runs:  # paired differences of mean zero: +1, 0, -1 thousandths over seeds
        index = HEADS.index(run["heads"])
        shift = 0.0 if index == 0 else 0.001 * (1, -1, 0)[(run["seed"] + index) % 3]
        for values in run["evals"].values():
            values["eval/bits_per_byte"] = 3.0 + 0.01 * run["seed"] + shift
    answer = lm_report.loss_answer(lm_stats.summarize(runs))
    assert "Not clearly: no head count differs from 1 head" in answer, answer


def test_one_seed_is_said_to_give_no_interval(tmp_path):
    runs = write_runs(tmp_path, seeds=(0,))
    summary = lm_stats.summarize(runs)
    diff = bpb(4, 0, STEPS[-1], -1) - bpb(1, 0, STEPS[-1], -1)
    answer = lm_report.loss_answer(summary)
    assert answer.startswith(lm_report.LOSS_QUESTION + " Not tested: one seed"), answer
    assert f"{diff:+.4f} at H = 4" in answer
    wins = lm_report.wins_answer(lm_stats.wins_change([r for r in runs if r["heads"] == 4]))
    assert wins.startswith(lm_report.WINS_QUESTION + " Not tested: one multi-head run"), wins


@pytest.mark.parametrize(("wins_sign", "word"), [(1, "Yes:"), (-1, "No, less often:")])
def test_the_wins_answer_flips_with_the_numbers(tmp_path, wins_sign, word):
    runs = write_runs(tmp_path, wins_sign=wins_sign)
    change = lm_stats.wins_change(runs)
    first = np.mean([np.mean(wins(h, s, STEPS[0], wins_sign)) for h in HEADS[1:] for s in SEEDS])
    assert change["first"] == pytest.approx(first)
    assert change["runs"] == len(HEADS[1:]) * len(SEEDS)
    assert lm_report.wins_answer(change).startswith(lm_report.WINS_QUESTION + " " + word)


def test_parameters_are_said_to_match_with_the_counts(tmp_path):
    runs = write_runs(tmp_path)
    counts = {r["params"] for r in runs}
    assert len(counts) == 1
    text = lm_report.markdown(runs)
    assert f"every head count has {counts.pop():,} parameters" in text
    assert [r["head_dim"] for r in runs if r["seed"] == 0] == [16 // h for h in HEADS]


def test_write_report_writes_the_report_json_and_plots(tmp_path):
    runs = write_runs(tmp_path / "runs", heads=(1, 4), seeds=(0, 1))
    written = {p.name for p in lm_report.write_report(runs, tmp_path / "report")}
    assert {"report.md", "results.json", "loss_vs_heads.png", "graphs_vs_step.png"} <= written
    saved = json.loads((tmp_path / "report" / "results.json").read_text())
    assert saved["paired_to_1_head"]["eval/bits_per_byte"]["4"]["n"] == 2


def test_no_lower_loss_at_any_head_count_is_a_no_even_where_some_are_unclear(tmp_path):
    """Higher at some head counts and not clearly different at the others answers No (the
    loss does not fall anywhere), and the lowest mean at 1 head is said without comparing
    1 head with itself."""
    runs = write_runs(tmp_path, loss_sign=1)
    for run in runs:  # 2 heads: paired differences of mean zero (+1, 0, -1 thousandths)
        if run["heads"] in (1, 2):
            shift = 0.0 if run["heads"] == 1 else 0.001 * (1, -1, 0)[run["seed"] % 3]
            for values in run["evals"].values():
                values["eval/bits_per_byte"] = 2.0 + 0.01 * run["seed"] + shift
    summary = lm_stats.summarize(runs)
    answer = lm_report.loss_answer(summary)
    assert answer.startswith(lm_report.LOSS_QUESTION + " No: against 1 head the loss is"), answer
    assert "not clearly different at H = 2" in answer, answer
    bits = summary["cells"]["eval/bits_per_byte"][1]["mean"]
    assert answer.endswith(f"The lowest mean is at 1 head: {bits:.4f} bits/byte."), answer


def test_share_intervals_are_cut_to_their_range_and_losses_are_not(tmp_path):
    """Wins of 0.9, 1.0 and 1.0 over three seeds: the t interval reaches past 1 (and the
    bits per byte's interval is as wide as its spread), and the report cuts only the
    share's, at 100% (the graph measures are shares and fidelities in [0, 1])."""
    runs = write_runs(tmp_path)
    for run, wins_last in zip([r for r in runs if r["heads"] == 4], (0.9, 1.0, 1.0), strict=True):
        run["evals"][STEPS[-1]]["wins_optimal"] = wins_last
        run["evals"][STEPS[-1]]["fidelity_optimal"] = 1.0 - wins_last  # near 0: cut there
    mean, low, high = brute_interval([0.9, 1.0, 1.0])
    assert high > 1.0
    for got in (
        lm_stats.summarize(runs)["cells"]["wins_optimal"][4],
        lm_stats.over_steps(runs, "wins_optimal")[4][STEPS[-1]],
    ):
        np.testing.assert_allclose([got["mean"], got["low"], got["high"]], [mean, low, 1.0])
    fidelity = lm_stats.summarize(runs)["cells"]["fidelity_optimal"][4]
    np.testing.assert_allclose([fidelity["low"], fidelity["high"]], [0.0, 1.0 - low])
    assert "96.7 [" + f"{100 * low:.1f}, 100.0]" in lm_report.markdown(runs)
    bpb_cell = lm_stats.summarize(runs)["cells"]["eval/bits_per_byte"][4]
    want = brute_interval([bpb(4, s, STEPS[-1], -1) for s in SEEDS])
    np.testing.assert_allclose([bpb_cell["mean"], bpb_cell["low"], bpb_cell["high"]], want)
    assert lm_stats.metric_range("eval/loss") is None


def test_wins_change_runs_from_first_to_last_graph_evaluation_of_multi_head_runs():
    """Evaluations with and without graphs: each 4-head run's change is its last graph
    evaluation's wins minus its first; the 1-head run (whose only head is the best head)
    and a run with one graph evaluation stay out."""
    w = lm_stats.OPTIMAL_WINS

    def run(heads, seed, by_step):
        evals = {step: ({w: x} if x is not None else {}) for step, x in by_step.items()}
        return {"run": f"h{heads}s{seed}", "heads": heads, "seed": seed, "evals": evals}

    runs = [
        run(1, 0, {0: 0.0, 10: 0.5, 20: 0.9}),
        run(4, 0, {0: 0.2, 10: 0.9, 20: 0.5, 30: None}),
        run(4, 1, {0: 0.4, 10: 0.1, 20: 0.6}),
        run(4, 2, {0: 0.3, 10: 0.3, 20: 0.7}),
        run(4, 3, {0: 0.8, 10: None}),  # one graph evaluation: no change to measure
    ]
    change = lm_stats.wins_change(runs)
    assert change["runs"] == 3
    assert change["first"] == pytest.approx(0.3, rel=1e-12)
    assert change["last"] == pytest.approx(0.6, rel=1e-12)
    got = change["change"]
    want = brute_interval([0.5 - 0.2, 0.6 - 0.4, 0.7 - 0.3])
    np.testing.assert_allclose([got["mean"], got["low"], got["high"]], want, rtol=1e-12)


def test_step_plot_draws_each_head_count_in_one_colour_in_both_panels(tmp_path):
    """Left: bits per byte of every head count; right: the optimal mix's wins (%) of the
    multi-head ones. A head count keeps its colour across the panels, and each line is
    its head count's mean over seeds at every step."""
    runs = write_runs(tmp_path)
    fig = lm_report.plot_vs_step(runs)
    left, right = ({ln.get_label(): ln for ln in ax.get_lines()} for ax in fig.axes)
    assert list(left) == [f"H={h}" for h in HEADS] and list(right) == [f"H={h}" for h in HEADS[1:]]
    assert len({ln.get_color() for ln in left.values()}) == len(HEADS)
    for h in HEADS:
        bpb_means = [np.mean([bpb(h, s, step, -1) for s in SEEDS]) for step in STEPS]
        np.testing.assert_allclose(left[f"H={h}"].get_ydata(), bpb_means, rtol=1e-12)
        if h == 1:
            continue
        assert right[f"H={h}"].get_color() == left[f"H={h}"].get_color()
        wins_means = [
            100 * np.mean([np.mean(wins(h, s, step, 1)) for s in SEEDS]) for step in STEPS
        ]
        np.testing.assert_allclose(right[f"H={h}"].get_ydata(), wins_means, rtol=1e-12)


def test_evaluations_in_any_order_are_read_in_step_order():
    """A run's evaluations may come in any order (a resumed run's lines): the first and
    last are the smallest and largest steps, and the curves run in step order."""
    w = lm_stats.OPTIMAL_WINS
    runs = [
        {"run": "a", "heads": 4, "seed": 0, "evals": {20: {w: 0.9}, 0: {w: 0.1}, 10: {w: 0.5}}},
        {"run": "b", "heads": 4, "seed": 1, "evals": {10: {w: 0.4}, 20: {w: 0.7}, 5: {w: 0.2}}},
    ]
    change = lm_stats.wins_change(runs)
    assert change["first"] == pytest.approx((0.1 + 0.2) / 2, rel=1e-12)
    assert change["last"] == pytest.approx((0.9 + 0.7) / 2, rel=1e-12)
    curve = lm_stats.over_steps(runs, w)[4]
    assert list(curve) == [0, 5, 10, 20]
    assert [curve[s]["mean"] for s in curve] == pytest.approx([0.1, 0.2, 0.45, 0.8], rel=1e-12)
