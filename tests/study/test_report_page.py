"""The study's index.html data: a layer entry per (run, layer) with the record's own
means, the measures against head count as report.aggregate gives them, and each run's
logged loss."""

import json

import pytest

from beyondpar.reports import html
from beyondpar.study import report, report_page


def stat(values):
    return {"mean": values, "std": [0.0] * len(values)}


def record(run, heads, seed, fid):
    return {
        "run": run,
        "step": 8,
        "task": "copy",
        "heads": heads,
        "seed": seed,
        "layers": 2,
        "metrics": {
            "fidelity": stat([fid, fid + 0.1]),
            "hitting_time": stat([5.0, 6.0]),
            "fidelity_uniform": stat([fid / 2, fid / 3]),
            "fidelity_per_head": stat([[fid - 0.01 * h for h in range(heads)]] * 2),
            "hitting_time_per_head": stat([[7.0 + h for h in range(heads)]] * 2),
        },
    }


@pytest.fixture
def records():
    return [record("h1-s0", 1, 0, 0.2), record("h4-s0", 4, 0, 0.4), record("h4-s1", 4, 1, 0.6)]


def test_layers_are_each_runs_mixes_and_heads(records):
    runs = report.latest(records)
    page = report_page.page(runs, report.aggregate(records), records)
    labels = [entry["label"] for entry in page["layers"]]
    assert labels[:3] == ["h1-s0, layer 1", "h1-s0, layer 2", "h4-s0, layer 1"]
    entry = page["layers"][3]["rows"]  # h4-s0, layer 2
    rows = {r["name"]: r["values"] for r in entry}
    heads = [(r["name"], r["head"]) for r in entry if r["kind"] == "head"]
    assert heads == [("head 1", 0), ("head 2", 1), ("head 3", 2), ("head 4", 3)]
    assert rows["mix: learned"][html.FIDELITY]["mean"] == pytest.approx(0.5)
    assert rows["mix: uniform"][html.FIDELITY]["mean"] == pytest.approx(0.4 / 3)
    assert "mix: optimal, held out" not in rows  # the records have no optimum
    # Index 2 (0.4 - 0.02, 7 + 2 steps) is shown as head 3.
    assert rows["head 3"] == {html.FIDELITY: {"mean": 0.38}, "hitting_time": {"mean": 9.0}}
    assert "Heads are numbered from 1: head h is index h-1" in page["notes"][0]


def test_series_are_the_aggregated_cells_and_loss_comes_from_metrics_jsonl(records, tmp_path):
    (tmp_path / "h4-s0").mkdir()
    lines = [{"step": 1, "train/loss": 2.0}, {"step": 2, "eval/accuracy": 0.5}]
    lines.append({"step": 3, "train/loss": 1.5})
    (tmp_path / "h4-s0" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = report_page.page(report.latest(records), report.aggregate(records), records, tmp_path)
    study = page["study"]
    assert study["head_counts"] == [1, 4]
    first = study["series"][0]
    assert (first["name"], first["unit"], first["heads"]) == ("copy, layer 1", "fraction", [1, 4])
    assert first["mean"] == pytest.approx([0.2, 0.5])
    assert first["std"][1] == pytest.approx(0.1 * 2**0.5)  # over the two seeds
    assert study["curves"] == [{"name": "h4-s0", "step": [1, 3], "loss": [2.0, 1.5]}]
