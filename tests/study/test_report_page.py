"""The study's index.html data: a layer entry per (run, layer) with the record's own
means, the measures against head count as report.aggregate gives them, each run's
logged loss, and a view of each run's attention under its layers' keys where the record
carries one."""

import json

import numpy as np
import pytest

from beyondpar.reports import html, packing
from beyondpar.study import report, report_page
from helpers.study_records import record, with_view


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


def test_each_run_with_attention_has_a_view_entry_per_layer(records):
    h1, attn_h1 = with_view(records[0], 1)
    h4, attn_h4 = with_view(records[1], 2)
    runs = report.latest([h1, h4, records[2]])  # the last: a record from before views
    page = report_page.page(runs, report.aggregate(runs), runs)
    keys = {entry["key"] for entry in page["layers"]}
    assert [v["name"] for v in page["views"]] == [
        "the first evaluation sequence of h1-s0",
        "the first evaluation sequence of h4-s0",
    ]
    for view, r, attn in zip(page["views"], (h1, h4), (attn_h1, attn_h4), strict=True):
        assert sorted(view["layers"]) == [f"{r['run']}/0", f"{r['run']}/1"]
        assert set(view["layers"]) <= keys  # the page's own layer keys
        assert (view["labels"], view["pool"]) == ([str(i) for i in range(6)], 1)
        for layer in range(2):
            packed = view["layers"][f"{r['run']}/{layer}"]
            drawn = packing.decode(packed["attention"], packed["shape"])
            assert np.all(np.abs(drawn - attn[layer]) <= packing.max_error(attn[layer]) + 1e-12)
            assert list(packed["mixes"]) == ["learned"]
    assert "Attention and flow to the sink" in page["notes"][0]


def test_records_without_attention_give_a_page_without_views(records, tmp_path):
    page = report_page.page(report.latest(records), report.aggregate(records), records)
    assert page["views"] == [] and "Attention" not in page["notes"][0]
    assert html.write(tmp_path, page).is_file()
