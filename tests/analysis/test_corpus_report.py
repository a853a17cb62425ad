"""The corpus report on a summary of known numbers: every cell is the summary's value, in
percent with its 95% interval as [low, high], in its own column."""

import fcntl
import os

import pytest

from beyondpar.analysis import corpus_report, statistics
from beyondpar.base import locks


def stat(mean: float) -> dict:
    """A window mean with an asymmetric interval, so that low and high cannot be confused."""
    return {"mean": mean, "low": mean - 0.01, "high": mean + 0.02}


def heads_stat(means: list[float]) -> dict:
    return {"mean": means, "low": [m - 0.01 for m in means], "high": [m + 0.02 for m in means]}


def mix(fidelity: float, gain: float, wins: float) -> dict:
    return {
        "fidelity": stat(fidelity),
        "gain": stat(gain),
        "wins_share": wins,
        "fidelity_median": stat(fidelity + 0.1),
        "fidelity_p10": stat(fidelity + 0.05),
        "hitting_time_normalized": stat(12.5),
    }


def layer(offset: float) -> dict:
    # Mixes in sorted (JSON) order: the report puts them as learned, uniform, optimal.
    return {
        "mixes": {
            "learned": mix(0.30 + offset, 0.05, 0.75),
            "optimal": mix(0.40 + offset, 0.15, 0.5),
            "uniform": mix(0.20 + offset, -0.05, 0.25),
        },
        "best_head": 2,
        "best_head_fidelity": stat(0.25 + offset),
        "sink_mass": heads_stat([0.1, 0.2, 0.6]),
        "heads": {
            "fidelity": heads_stat([0.1, 0.15, 0.25 + offset]),
            "fidelity_median": heads_stat([0.2, 0.25, 0.3]),
            "fidelity_p10": heads_stat([0.12, 0.17, 0.27]),
            "hitting_time_normalized": heads_stat([20.0, 15.0, 9.0]),
        },
    }


@pytest.fixture
def summary() -> dict:
    return {
        "source": "tiny",
        "corpus": "docs",
        "num_documents": 3,
        "num_windows": 4,
        "tokens_per_window": 16,
        "total_windows": 9,
        "documents_used": 2,
        "dropped_tail_tokens": 5,
        "short_documents": 1,
        "spec": {"horizon": 20, "max_steps": 30, "sink_tokens": 0},
        "rollout": {"network_fidelity": stat(0.02), "first_token_share": stat(0.9)},
        "baseline": {
            "baseline": {
                "fidelity": 0.0625,
                "fidelity_median": 0.08,
                "fidelity_p10": 0.07,
                "hitting_time_normalized": 6.5,
            }
        },
        "layers": {"0": layer(0.0), "1": layer(0.01)},
        "pruning": {
            "windows": 2,
            "projection": {
                "heads_pruned": [0, 3, 6],
                "loss": [2.0, 2.5, 3.0],
                "perplexity": [7.389, 12.18, 20.09],
                "loss_auc": 2.5,
                "accuracy_auc": 0.4,
            },
        },
    }


def cells(report: str, heading: str, block: int = 1) -> dict[str, list[str]]:
    """The table `block` paragraphs below `heading`, by its first cell."""
    lines = report[report.index(heading) :].split("\n\n")[block].splitlines()
    return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in lines[2:]}


def test_the_corpus_line_counts_windows_and_the_documents_they_come_from(summary):
    """The documents used are those the kept windows come from, not all the corpus's."""
    report = corpus_report.markdown(summary)
    assert (
        "Corpus docs: 3 documents; 4 windows of 16 tokens (of 9 in the corpus, taken in "
        "document order, consecutive within a document) from 2 documents. Dropped: 5 tail "
        "tokens shorter than a window, 1 documents shorter than one window."
    ) in report


def test_layer_rows_give_mean_low_high_in_percent_with_mixes_in_report_order(summary):
    """Mixes read back from JSON come sorted by name; the report shows learned, uniform,
    then the held-out optimum, each as fidelity, gain over the best head and share of
    windows won in percent; the sink mass is the mean over heads."""
    report = corpus_report.markdown(summary)
    header = report[report.index("## Layers\n") :].splitlines()[2]
    assert header.index("learned (%)") < header.index("uniform (%)")
    assert header.index("uniform (%)") < header.index("optimal, held out (%)")
    rows = cells(report, "## Layers\n")
    assert rows["2"] == [
        "3",  # the summary's best head is index 2: head 3, numbered from 1
        "26.000 [25.000, 28.000]",
        "31.000 [30.000, 33.000]",
        "5.000 [4.000, 7.000]",
        "75%",
        "21.000 [20.000, 23.000]",
        "-5.000 [-6.000, -3.000]",
        "25%",
        "41.000 [40.000, 43.000]",
        "15.000 [14.000, 17.000]",
        "50%",
        "0.300",
    ]


def test_layers_are_numbered_from_one_and_the_top_says_how_keys_map(summary):
    """Summary key "k" (corpus.json, windows.jsonl) is layer k + 1 in the report: in the
    layer table, in the per-layer headings, and said at the top."""
    report = corpus_report.markdown(summary)
    assert report.splitlines()[2] == (
        "Layers are numbered from 1, as in the paper: layer k in this report is key k-1 in "
        "corpus.json and windows.jsonl. Heads are numbered from 1: head h is index h-1 of "
        "each per-head list in the JSON outputs."
    )
    assert list(cells(report, "## Layers\n"))[:2] == ["1", "2"]
    assert "### Layer 1\n" in report and "### Layer 2\n" in report
    assert "### Layer 0" not in report


def test_baseline_row_fills_the_table_width(summary):
    """The baseline's fidelity sits under the first mix; every row has as many cells as
    the header has columns."""
    report = corpus_report.markdown(summary)
    table = report[report.index("## Layers\n") :].split("\n\n")[1].splitlines()
    widths = {line.count("|") for line in table}
    assert len(widths) == 1
    assert cells(report, "## Layers\n")["baseline: uniform causal"][:3] == ["-", "-", "6.250"]


def test_head_table_gives_hitting_time_in_steps_and_the_baseline_in_percent(summary):
    """Fidelities in percent with intervals, hitting time unscaled in steps, each head's
    sink mass from its own entry, and the baseline row in the same units."""
    rows = cells(corpus_report.markdown(summary), "### Layer 2")
    assert [name for name in rows if name.startswith("head")] == ["head 1", "head 2", "head 3"]
    assert rows["head 3"] == [  # index 2
        "26.000 [25.000, 28.000]",
        "30.000 [29.000, 32.000]",
        "27.000 [26.000, 29.000]",
        "9.00 [8.99, 9.02]",
        "0.600",
    ]
    assert rows["mix: uniform"][3] == "12.50 [12.49, 12.52]"
    assert rows["baseline: uniform causal"] == ["6.250", "8.000", "7.000", "6.50", "-"]


def test_pruning_row_gives_the_curves_first_and_last_points(summary):
    """Loss with all heads is the curve's first point; loss and perplexity at the last
    point are its end; the windows entry is no order."""
    row = cells(corpus_report.markdown(summary), "## Pruning heads", 2)["projection"]
    assert row == ["2.000", "3.000", "20.1", "2.500", "0.400"]


def test_table_without_sink_has_its_own_baseline_and_values(summary):
    """With one sink token, a second layer table reads each layer from its graph without
    the sink and closes with that graph's own uniform causal baseline; the sink mass is
    the full graph's, and the first table keeps the full baseline."""
    summary["spec"]["sink_tokens"] = 1
    summary["baseline"]["baseline_without_sink"] = {
        "fidelity": 0.075,
        "fidelity_median": 0.09,
        "fidelity_p10": 0.085,
        "hitting_time_normalized": 5.5,
    }
    for name, full in summary["layers"].items():
        full["without_sink"] = layer(0.05 + 0.01 * int(name))
    report = corpus_report.markdown(summary)
    rows = cells(report, "## Layers without the first 1 token(s)")
    assert rows["baseline: uniform causal"][:3] == ["-", "-", "7.500"]
    assert rows["2"][:3] == ["3", "31.000 [30.000, 33.000]", "36.000 [35.000, 38.000]"]
    assert rows["2"][-1] == "0.300"
    assert cells(report, "## Layers\n")["baseline: uniform causal"][2] == "6.250"


def test_a_folder_another_process_writes_is_refused_with_nothing_written(summary, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    other = os.open(out / locks.LOCK_FILE, os.O_RDWR | os.O_CREAT)  # as another process's
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(locks.FolderBusy, match=f"{out} is in use by another process"):
            corpus_report.write(summary, out)
        assert sorted(p.name for p in out.iterdir()) == [locks.LOCK_FILE]
    finally:
        os.close(other)
    names = sorted(p.name for p in corpus_report.write(summary, out))
    assert names[-1] == "report.md"


@pytest.mark.parametrize("sink_tokens", [0, 2])
def test_the_optimum_line_names_a_search_without_the_sink_only_when_there_is_one(sink_tokens):
    optimal = {"folds": [[0, 2], [2, 4]], "search_windows": [[2, 3], [0, 1]], "held_out": True}
    line = corpus_report._optimal_line(optimal, sink_tokens)
    assert "fold 0 (windows 0-1) searched on windows 2, 3" in line
    assert ("without the sink tokens has its own search" in line) == bool(sink_tokens)


def test_a_report_without_sink_tokens_says_nothing_of_a_search_without_them(summary):
    """The report passes its own sink-token count to the optimum's line."""
    summary["optimal"] = {
        "folds": [[0, 2], [2, 4]],
        "search_windows": [[2, 3], [0, 1]],
        "held_out": True,
    }
    report = corpus_report.markdown(summary)
    assert "fold 1 (windows 2-3) searched on windows 0, 1" in report
    assert "without the sink tokens has its own search" not in report


@pytest.mark.parametrize(
    ("documents", "said", "scope"),
    [
        (
            [0] * 16 + [1] * 16,
            "95% intervals: cluster bootstrap over 2 documents (32 windows)",
            "describe these documents only",
        ),
        (
            [5] * 32,
            "95% intervals: circular block bootstrap over the 32 windows of 1 document",
            "describe this document only",
        ),
    ],
)
def test_the_report_says_how_its_intervals_resampled_and_what_they_describe(
    summary, documents, said, scope
):
    """The paragraph after the values line names the method and its units, and with
    fewer than 10 documents that the intervals describe these documents only."""
    summary["intervals"] = statistics.resampling(32, documents).as_dict()
    report = corpus_report.markdown(summary)
    paragraph = next(p for p in report.split("\n\n") if p.startswith("95% intervals:"))
    assert paragraph.startswith(said)
    assert scope in paragraph
    assert report.index("Values: mean over windows") < report.index(said)


def test_many_documents_are_reported_without_the_caveat(summary):
    summary["intervals"] = statistics.resampling(40, list(range(20)) * 2).as_dict()
    line = corpus_report.intervals_line(summary)
    assert line.startswith("95% intervals: cluster bootstrap over 20 documents (40 windows)")
    assert "only" not in line


def test_a_summary_from_before_document_intervals_says_windows_were_independent(summary):
    """corpus.json written by an earlier version has no 'intervals': its report says
    its intervals treated windows as independent."""
    summary.pop("intervals", None)
    assert "treated as independent" in corpus_report.intervals_line(summary)
    assert "95% intervals: bootstrap over windows" in corpus_report.markdown(summary)
