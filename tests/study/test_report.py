"""Reports: a golden Markdown file from synthetic records, CSV/JSON rows and plots."""

import json
import os

import numpy as np
import pytest

from beyondpar.study import evaluate, report, synergy_report
from helpers.paths import DATA

GOLDEN = DATA / "golden_report.md"


def record(run, task, heads, seed, step, offset):
    """A synthetic record with 2 layers whose numbers follow from its arguments."""
    base = 0.01 * heads + 0.001 * seed + offset

    def stat(values, spread=0.0):
        return {
            "mean": values,
            "std": [spread] * len(values) if isinstance(values, list) else spread,
        }

    fid = [base, base + 0.002]
    best = [base - 0.001 * (heads > 1), base + 0.003]
    return {
        "run": run,
        "step": step,
        "task": task,
        "heads": heads,
        "seed": seed,
        "layers": 2,
        "num_sequences": 4,
        "walk": "reference",
        "metrics": {
            "hitting_time": stat([10.0 / heads + seed, 5.0 + seed], 0.5),
            "tv_mixing_time": stat([101.0, 101.0]),
            "spectral_mixing_time": stat([100.0, 100.0]),
            "fidelity": stat(fid, 0.001),
            "fidelity_uniform": stat(fid, 0.001),
            "best_individual": stat(best, 0.001),
            "gain": stat([f - b for f, b in zip(fid, best, strict=True)], 0.001),
            "combined_wins": stat([1.0 * (heads > 1), 0.0]),
            "accuracy": stat(0.9 + 0.01 * heads + offset),
            "accuracy_predictable": stat(0.95 + 0.001 * heads),
            "tv_mixing_time_normalized": stat([12.0 - heads, 8.0]),
            "fidelity_optimal": stat([f + 0.001 for f in fid]),
            "fidelity_optimal_in_sample": stat([f + 0.0015 for f in fid]),
            "hitting_time_optimal": stat([9.0 / heads + seed, 4.5 + seed]),
            "hitting_time_optimal_in_sample": stat([8.9 / heads + seed, 4.4 + seed]),
            "hitting_time_uniform": stat([11.0 / heads + seed, 5.5 + seed]),
            "hitting_time_best_head": stat([9.5 / heads + seed, 4.8 + seed]),
            "hitting_time_per_head": stat([[9.5 / heads + seed] * heads, [4.8 + seed] * heads]),
            "fidelity_per_head": stat([[b] * heads for b in best]),
            "head_diversity": stat([0.1 * heads + 0.01 * seed + offset, 0.2 + 0.01 * seed]),
            "pairwise_synergy": stat([np.eye(heads).tolist()] * 2),
        },
        "seq_len": 32,
        "evaluation": {
            "num_sequences": 4,
            "seed": 1234,
            "horizon": 100,
            "max_steps": 100,
            "walk": "reference",
        },
        **({"pruning": pruning(heads, offset)} if heads > 1 else {}),
    }


def pruning(heads, offset):
    accuracy = [1.0 - 0.1 * k * (1 + offset) for k in range(2 * heads - 1)]
    curve = {
        "heads_pruned": list(range(len(accuracy))),
        "accuracy": accuracy,
        "fidelity": [[0.1, 0.1]] * len(accuracy),
        "hitting_time": [[3.0, 3.0]] * len(accuracy),
        "order": [[0, h] for h in range(len(accuracy) - 1)],
    }
    return {
        "projection": {
            **curve,
            "auc": float(np.trapezoid(accuracy, np.linspace(0, 1, len(accuracy)))),
        },
        "random": {**curve, "auc": 0.5},
    }


def synthetic_records():
    out = []
    for task in ("copy", "cycle"):
        for heads in (1, 4):
            for seed in (0, 1):
                run = f"{task}-h{heads}-s{seed}"
                out.append(record(run, task, heads, seed, 10, 0.0))
                out.append(record(run, task, heads, seed, 20, 0.1 if task == "copy" else 0.0))
    return out


def test_markdown_matches_golden():
    text = report.markdown(synthetic_records())
    if os.environ.get("BEYONDPAR_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), (
        "report.md changed; if on purpose, update the reference with "
        "BEYONDPAR_UPDATE_GOLDEN=1 pytest tests/test_report.py and review the diff"
    )


def test_optimal_table_puts_every_column_in_its_unit():
    """Fidelity in % in all five fidelity columns (the best head's too), hitting time in
    steps; the in-sample optimum is never below the best single head (the held-out one may
    be)."""

    runs = [record("r", "copy", 4, 0, 10, 0.0), record("s", "copy", 4, 1, 10, 0.0)]
    rows = [line.split("|")[1:-1] for line in synergy_report.optimal_table(runs, "copy")[2:]]
    for layer, row in enumerate(rows):
        cells = [float(c) for c in row]
        best = np.mean([np.max(r["metrics"]["fidelity_per_head"]["mean"][layer]) for r in runs])
        fastest = np.mean(
            [np.min(r["metrics"]["hitting_time_per_head"]["mean"][layer]) for r in runs]
        )
        assert cells[:2] == [4, layer + 1]
        assert cells[6] == pytest.approx(100 * best, abs=0.006)
        assert cells[3] >= cells[6] and cells[8] <= cells[11]
        assert cells[11] == pytest.approx(fastest, abs=0.006)


def test_best_head_columns_take_the_most_faithful_and_the_fastest_head():
    """Per layer, the best head's fidelity is the largest of the heads' means and its
    hitting time the smallest, whichever heads those are."""
    r = record("r", "copy", 4, 0, 10, 0.0)
    r["metrics"]["fidelity_per_head"]["mean"] = [[0.1, 0.3, 0.2, 0.05], [0.4, 0.1, 0.15, 0.2]]
    r["metrics"]["hitting_time_per_head"]["mean"] = [[7.0, 3.0, 5.0, 9.0], [2.0, 6.0, 4.0, 8.0]]
    rows = [line.split("|")[1:-1] for line in synergy_report.optimal_table([r], "copy")[2:]]
    assert [(row[6].strip(), row[11].strip()) for row in rows] == [
        ("30.00", "3.00"),
        ("40.00", "2.00"),
    ]


def diversity_run(heads, diversity, gain):
    metrics = {"head_diversity": {"mean": diversity}, "gain": {"mean": gain}}
    return {"heads": heads, "metrics": metrics}


def test_diversity_correlation_needs_three_points_of_multi_head_runs():
    """Spearman's rho of diversity against gain over (run, layer) points of runs with more
    than one head. Ranks (1, 2, 3) against (1, 3, 2) give rho = 1/2, and with n = 3 its
    t statistic 1/sqrt(3) on one degree of freedom gives p = 1 - (2/pi) atan(1/sqrt(3))
    = 2/3. Two points carry no rank correlation to report."""
    single = diversity_run(1, [0.9, 0.0], [0.5, -0.5])
    runs = [diversity_run(2, [0.1, 0.2], [0.01, 0.03]), diversity_run(3, [0.3], [0.02]), single]
    (line,) = synergy_report.diversity_summary(runs)
    assert line.startswith("Over 3 (run, layer) points")
    assert "rho = +0.500 (p = 0.667)" in line
    assert synergy_report.diversity_summary([runs[0], single]) == []


def test_diversity_plot_title_gives_rho_then_p_from_three_points_on():
    """The diversity plot shows every multi-head (run, layer) point as (diversity, gain in
    percentage points) and titles it with Spearman's rho, then its p value: for ranks
    (1, 2, 3) against (1, 3, 2), rho = 1/2 and p = 2/3. Three points are the fewest that
    get a title; two get none."""
    from beyondpar.base import files

    plt = files.pyplot()
    single = diversity_run(1, [0.9, 0.0], [0.5, -0.5])
    runs = [diversity_run(2, [0.1, 0.2], [0.01, 0.03]), diversity_run(3, [0.3], [0.02]), single]
    fig = synergy_report.plot_diversity(runs, plt)
    try:
        (ax,) = fig.axes
        assert ax.get_title() == "Spearman rho = +0.50 (p = 0.67)"
        points = ax.collections[0].get_offsets()
        np.testing.assert_allclose(points, [[0.1, 1.0], [0.2, 3.0], [0.3, 2.0]])
    finally:
        plt.close(fig)
    fig = synergy_report.plot_diversity([runs[0], single], plt)
    try:
        assert fig.axes[0].get_title() == ""
    finally:
        plt.close(fig)


def test_rows_carry_each_metrics_own_std_per_layer():
    """Every CSV/JSON row holds, for its layer, the mean and the standard deviation that the
    record stores for that metric: the two columns differ wherever the record's do."""
    r = record("copy-h4-s3", "copy", 4, 3, 30, 0.0)
    r["metrics"]["hitting_time"] = {"mean": [7.0, 5.0], "std": [0.25, 0.75]}
    r["metrics"]["fidelity"] = {"mean": [0.2, 0.3], "std": [0.01, 0.04]}
    table = report.rows([r])
    assert [row["layer"] for row in table] == [1, 2]
    expected = zip([0.25, 0.75], [0.01, 0.04], [0.2, 0.3], strict=True)
    for row, (ht_std, fid_std, fid_mean) in zip(table, expected, strict=True):
        assert row["hitting_time_steps_std"] == ht_std
        assert row["fidelity_fraction_std"] == fid_std
        assert row["fidelity_fraction_mean"] == fid_mean
        assert row["run"] == "copy-h4-s3" and row["step"] == 30 and row["seed"] == 3


def test_optimal_table_gives_each_weighting_its_own_column():
    """Optimal, learned and uniform weights and the best head each fill their own column,
    for fidelity (%) and hitting time (steps): with a distinct number in every field a
    column that showed another weighting's value would not match."""
    r = record("r", "copy", 2, 0, 10, 0.0)
    m = r["metrics"]
    m["fidelity_optimal"]["mean"] = [0.41, 0.42]
    m["fidelity_optimal_in_sample"]["mean"] = [0.51, 0.52]
    m["fidelity"]["mean"] = [0.31, 0.32]
    m["fidelity_uniform"]["mean"] = [0.21, 0.22]
    m["fidelity_per_head"]["mean"] = [[0.11, 0.13], [0.17, 0.12]]
    m["hitting_time_optimal"]["mean"] = [1.5, 2.5]
    m["hitting_time_optimal_in_sample"]["mean"] = [1.25, 2.25]
    m["hitting_time"]["mean"] = [3.5, 4.5]
    m["hitting_time_uniform"]["mean"] = [5.5, 6.5]
    m["hitting_time_per_head"]["mean"] = [[8.0, 7.5], [9.5, 9.0]]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in synergy_report.optimal_table([r], "copy")[2:]
    ]
    assert rows == [
        ["2", "1", "41.00", "51.00", "31.00", "21.00", "13.00"]
        + ["1.50", "1.25", "3.50", "5.50", "7.50"],
        ["2", "2", "42.00", "52.00", "32.00", "22.00", "17.00"]
        + ["2.50", "2.25", "4.50", "6.50", "9.00"],
    ]


def test_a_first_format_record_shows_its_optimum_as_in_sample():
    """Records written before the optimum was held out scored it on the sequences it was
    searched on: read back, that value fills the in-sample column and the held-out column
    stays empty, never the other way round."""
    r = record("r", "copy", 2, 0, 10, 0.0)
    m = r["metrics"]
    del m["fidelity_optimal_in_sample"], m["hitting_time_optimal_in_sample"]
    m["fidelity_optimal"]["mean"] = [0.41, 0.42]
    m["hitting_time_optimal"]["mean"] = [1.5, 2.5]
    old = evaluate.upgrade(r)
    assert old["format"] == evaluate.RECORD_FORMAT and "fidelity_optimal" not in old["metrics"]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in synergy_report.optimal_table([old], "copy")[2:]
    ]
    assert [row[2:4] + row[7:9] for row in rows] == [
        ["-", "41.00", "-", "1.50"],
        ["-", "42.00", "-", "2.50"],
    ]


def test_records_of_a_newer_format_are_refused_in_one_line(tmp_path):
    path = tmp_path / "evaluation.jsonl"
    r = {**record("r", "copy", 2, 0, 10, 0.0), "format": evaluate.RECORD_FORMAT + 1}
    path.write_text(json.dumps(r) + "\n")
    with pytest.raises(ValueError, match=r"record format must be 1 or 2, got 3") as err:
        evaluate.read_records(path)
    assert "\n" not in str(err.value)


def test_the_amplification_table_has_a_row_per_layer_of_every_multi_head_count():
    """Heads 4 and 8 of one task: each count's layers in order, each row its own cell's
    numbers (a second head count once reused the first's table)."""
    runs = [record(f"r{h}", "copy", h, 0, 10, 0.0) for h in (1, 4, 8)]
    text = report.markdown(runs)
    section = text[text.index("### Amplification") :].split("\n\n")[1].splitlines()[2:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in section]
    assert [row[:2] for row in rows] == [["4", "1"], ["4", "2"], ["8", "1"], ["8", "2"]]
    for row, r in zip(rows, [runs[1], runs[1], runs[2], runs[2]], strict=True):
        layer = int(row[1]) - 1
        best = 100 * r["metrics"]["best_individual"]["mean"][layer]
        assert row[2] == f"{best:.2f}"
