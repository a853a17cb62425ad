"""Reports: a golden Markdown file from synthetic records, CSV/JSON rows and plots."""

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from beyondpar.study import report, synergy_report
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
            "hitting_time_optimal": stat([9.0 / heads + seed, 4.5 + seed]),
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
    """Fidelity in % in all four fidelity columns (the best head's too), hitting time in
    steps; the optimum is never below the best single head."""

    runs = [record("r", "copy", 4, 0, 10, 0.0), record("s", "copy", 4, 1, 10, 0.0)]
    rows = [line.split("|")[1:-1] for line in synergy_report.optimal_table(runs, "copy")[2:]]
    for layer, row in enumerate(rows):
        cells = [float(c) for c in row]
        best = np.mean([np.max(r["metrics"]["fidelity_per_head"]["mean"][layer]) for r in runs])
        fastest = np.mean(
            [np.min(r["metrics"]["hitting_time_per_head"]["mean"][layer]) for r in runs]
        )
        assert cells[:2] == [4, layer + 1]
        assert cells[5] == pytest.approx(100 * best, abs=0.006)
        assert cells[2] >= cells[5] and cells[6] <= cells[9]
        assert cells[9] == pytest.approx(fastest, abs=0.006)


def test_aggregate_over_seeds():
    cells = report.aggregate(synthetic_records())
    mean, std, seeds = cells[("copy", 4)]["fidelity"]
    # latest step (20): base = 0.04 + 0.001 * seed + 0.1, seeds 0 and 1
    np.testing.assert_allclose(mean, [0.1405, 0.1425])
    np.testing.assert_allclose(std, [np.std([0.140, 0.141], ddof=1)] * 2)
    assert seeds == 2


def test_files_and_plots(tmp_path):
    records = synthetic_records()
    written = report.write_report(records, tmp_path)
    names = sorted(p.name for p in written)
    multi = [
        f"{kind}_{task}-h4-s{seed}.png"
        for kind in ("pruning", "synergy")
        for task in ("copy", "cycle")
        for seed in (0, 1)
    ]
    assert names == sorted(
        [
            "amplification.png",
            "diversity.png",
            "metrics_vs_heads.png",
            "metrics_vs_step.png",
            "report.md",
            "results.csv",
            "results.json",
            *multi,
        ]
    )
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == len(records) * 2
    assert json.loads((tmp_path / "results.json").read_text())[0]["layer"] == 1
    first = next(
        r for r in rows if r["run"] == "copy-h4-s1" and r["step"] == "20" and r["layer"] == "2"
    )
    assert float(first["fidelity_fraction_mean"]) == pytest.approx(0.143)
    assert float(first["hitting_time_steps_mean"]) == pytest.approx(6.0)
    assert float(first["tv_mixing_time_normalized_steps_mean"]) == pytest.approx(8.0)
    assert float(first["pruning_auc_random_fraction"]) == pytest.approx(0.5)
    one_head = next(r for r in rows if r["run"] == "copy-h1-s0")
    assert one_head["pruning_auc_random_fraction"] == ""  # no heads to prune
    for name in names:
        if name.endswith(".png"):
            assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert not list(Path(tmp_path).glob(".*"))


def test_empty_records():
    with pytest.raises(ValueError, match="records must not be empty"):
        report.markdown([])


def test_report_says_which_tasks_need_attention():
    records = synthetic_records()
    for r in records:
        needed = r["task"] != "copy"
        r["attention_necessity"] = {
            "accuracy": 1.0,
            "accuracy_without_heads": 0.01 if needed else 1.0,
            "accuracy_without_layer": [0.5, 0.5, 0.5, 0.5],
            "chance": 1 / 256,
            "needs_attention": needed,
        }
    text = report.markdown(records)
    assert "## Does the task need attention?" in text
    assert "| copy | " in text and "| 100.0 | 100.0 | 0.39 | no |" in text
    assert "**copy does not need attention**" in text
    assert "**cycle does not need attention**" not in text
    rows = report.rows(records)
    assert {r["needs_attention"] for r in rows if r["task"] == "copy"} == {False}


def with_necessity(r, needed):
    r["attention_necessity"] = {
        "accuracy": 0.8,
        "accuracy_without_heads": 0.3,
        "chance": 0.1,
        "needs_attention": needed,
    }
    return r


def test_attention_need_is_a_strict_majority_of_runs():
    """A task needs attention only when more than half of its runs say so: a tie is no
    majority, so the report must say the task does not need attention; two runs of
    three are a majority."""
    tie = [
        with_necessity(record("a", "copy", 4, 0, 10, 0.0), True),
        with_necessity(record("b", "copy", 4, 1, 10, 0.0), False),
    ]
    found = report.necessity_by_task(tie)["copy"]
    assert found["needs_attention"] is False and found["runs"] == 2
    assert "| copy | 2 | 80.0 | 30.0 | 10.00 | no |" in report.necessity_table({"copy": found})
    assert "**copy does not need attention**" in report.markdown(tie)
    two_of_three = [*tie, with_necessity(record("c", "copy", 4, 2, 10, 0.0), True)]
    assert report.necessity_by_task(two_of_three)["copy"]["needs_attention"] is True
    assert "does not need attention" not in report.markdown(two_of_three)


def test_amplification_counts_only_strict_gains_as_wins():
    """'Combined beats the best single head' counts (heads, layer) cells whose gain is
    positive: a cell where heads combined only tie the best head (gain exactly 0) is no
    win, and a negative gain is none either."""
    r = record("a", "copy", 4, 0, 10, 0.0)
    r["metrics"]["gain"]["mean"] = [0.0, 0.002]
    s = record("b", "copy", 2, 0, 10, 0.0)
    s["metrics"]["gain"]["mean"] = [-0.001, 0.0]
    text = report.markdown([r, s, record("c", "copy", 1, 0, 10, 0.0)])
    assert "Combined beats the best single head in 1 of 4 (heads, layer) cells." in text
    # heads 4, layer 1: best 4.00 - 0.10, combined 4.00, gain +0.00, combined wins 100%
    assert "| 4 | 1 | 3.90 | 4.00 | +0.00 | 100% |" in text
    assert "| 4 | 2 | 4.30 | 4.20 | +0.20 | 0% |" in text
    assert "| 2 | 1 | 1.90 | 2.00 | -0.10 | 100% |" in text


def test_best_head_columns_take_the_most_faithful_and_the_fastest_head():
    """Per layer, the best head's fidelity is the largest of the heads' means and its
    hitting time the smallest, whichever heads those are."""
    r = record("r", "copy", 4, 0, 10, 0.0)
    r["metrics"]["fidelity_per_head"]["mean"] = [[0.1, 0.3, 0.2, 0.05], [0.4, 0.1, 0.15, 0.2]]
    r["metrics"]["hitting_time_per_head"]["mean"] = [[7.0, 3.0, 5.0, 9.0], [2.0, 6.0, 4.0, 8.0]]
    rows = [line.split("|")[1:-1] for line in synergy_report.optimal_table([r], "copy")[2:]]
    assert [(row[5].strip(), row[9].strip()) for row in rows] == [
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
    m["fidelity"]["mean"] = [0.31, 0.32]
    m["fidelity_uniform"]["mean"] = [0.21, 0.22]
    m["fidelity_per_head"]["mean"] = [[0.11, 0.13], [0.17, 0.12]]
    m["hitting_time_optimal"]["mean"] = [1.5, 2.5]
    m["hitting_time"]["mean"] = [3.5, 4.5]
    m["hitting_time_uniform"]["mean"] = [5.5, 6.5]
    m["hitting_time_per_head"]["mean"] = [[8.0, 7.5], [9.5, 9.0]]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in synergy_report.optimal_table([r], "copy")[2:]
    ]
    assert rows == [
        ["2", "1", "41.00", "31.00", "21.00", "13.00", "1.50", "3.50", "5.50", "7.50"],
        ["2", "2", "42.00", "32.00", "22.00", "17.00", "2.50", "4.50", "6.50", "9.00"],
    ]
