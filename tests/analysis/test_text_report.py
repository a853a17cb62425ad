"""The single-text report: every cell is the record's number, in its own column."""

import fcntl
import os

import numpy as np
import pytest

from beyondpar import graphs, measure
from beyondpar.analysis import text as text_lib
from beyondpar.analysis import text_report
from beyondpar.base import files, locks

T = 8
# Three sequences in every record below: the best-head test needs a majority of them, and
# one batch size lets the records share their compiled kernels.
B = 3


def record(spec: measure.MeasureSpec, attn) -> dict:
    """What `text.attention_record` gives for attention B x L x H x T x T."""
    b, num_layers, h = attn.shape[:3]
    meta = dict(source="attn.npz", num_layers=num_layers, num_heads=h, num_sequences=b)
    return {**meta, "seq_len": T, "spec": vars(spec), **text_lib.analyze_attention(attn, spec)}


def table_rows(report: str, heading: str) -> dict[str, list[str]]:
    lines = report[report.index(heading) :].split("\n\n")[1].splitlines()
    return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in lines[2:]}


@pytest.fixture(scope="module")
def parked():
    """Three sequences of one layer: head index 1 reads every earlier token evenly,
    indices 0 and 2 only their own token, so index 1 (head 2 in the report) is every
    sequence's best head."""
    uniform = np.asarray(graphs.uniform_causal(T))
    heads = np.stack([np.eye(T), uniform, np.eye(T)]).astype(np.float32)
    attn = np.stack([heads] * B)[:, None]  # B x L x H x T x T
    spec = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False)
    return record(spec, attn)


def test_layer_row_names_the_most_frequent_best_head_numbered_from_one(parked):
    """The record's best head is index 1; the report numbers heads from 1, so "2"."""
    assert parked["layers"][0]["best_head"].tolist() == [1] * B
    row = table_rows(text_report.markdown(parked), "## Layers")["1"]
    assert row[0] == "2"


def test_layers_are_numbered_from_one_and_the_top_says_how_keys_map(parked):
    """Record key k (the checkpoint's layer index, `--layers`) is layer k + 1 in the
    report: in the layer table, in the per-layer headings, and said at the top."""
    layer = parked["layers"][0]
    report = text_report.markdown({**parked, "layers": {0: layer, 7: layer}})
    assert report.splitlines()[2] == (
        "Layers are numbered from 1, as in the paper: layer k in this report is key k-1 in "
        "analysis.json and the `--layers` flag. Heads are numbered from 1: head h is index "
        "h-1 of each per-head list in the JSON outputs."
    )
    assert list(table_rows(report, "## Layers"))[:2] == ["1", "8"]
    assert "### Layer 1\n" in report and "### Layer 8\n" in report
    assert "### Layer 0" not in report


def test_head_rows_give_hitting_time_on_each_walk_in_its_column(parked):
    heads = parked["layers"][0]["heads"]
    ref, norm = heads["hitting_time_reference"][:, 1], heads["hitting_time_normalized"][:, 1]
    assert abs(np.mean(ref) - np.mean(norm)) > 0.01  # the walks differ on this head
    rows = table_rows(text_report.markdown(parked), "### Layer 1")
    assert [name for name in rows if name.startswith("head")] == ["head 1", "head 2", "head 3"]
    row = rows["head 2"]  # index 1
    assert row[3:5] == [f"{np.mean(ref):.2f}", f"{np.mean(norm):.2f}"]


def test_largest_shares_are_listed_largest_first(parked):
    share = np.mean(parked["rollout"]["sink_share"], 0)
    line = next(x for x in text_report.markdown(parked).splitlines() if "Largest shares" in x)
    listed = [int(part.split()[0]) for part in line.split(": ", 2)[-1].split(", ")]
    assert listed == np.argsort(-share)[:5].tolist()


def test_the_optimum_line_gives_held_out_and_in_sample_values():
    attn = np.asarray(graphs.random_causal(8, (B, 1, 3), T))  # B x L x H x T x T
    spec = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, optimal_weights=True)
    layer = record(spec, attn)["layers"][0]
    line = text_report.optimal_line(layer)
    held_out = 100 * np.mean(layer["mixes"]["optimal"]["fidelity"])
    in_sample = 100 * np.mean(layer["optimal"]["in_sample"])
    assert abs(held_out - in_sample) > 1e-3
    assert f"{held_out:.3f}% held out" in line and f"{in_sample:.3f}% in sample" in line


def test_learned_mix_columns_are_the_learned_mix_not_the_uniform_one():
    """With head weights known, the layer row's learned-mix column and its gain are those
    of the learned mix: all weight on the even-reading head 1 gives that head's 12.5%
    (1 / T) and no gain over it, against the lower uniform mix beside it."""
    uniform = np.asarray(graphs.uniform_causal(T))
    heads = np.stack([np.eye(T), uniform, np.eye(T)]).astype(np.float32)
    attn = np.stack([heads] * B)  # B x H x T x T
    spec = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False)
    layer = measure.measure_layer(attn, np.array([0.0, 1.0, 0.0]), spec)
    rec = {**record(spec, attn[:, None]), "layers": {3: layer}}
    learned = 100 * np.mean(layer["mixes"]["learned"]["fidelity"])
    mixed = 100 * np.mean(layer["mixes"]["uniform"]["fidelity"])
    assert learned == pytest.approx(100 / T, abs=1e-3) and mixed < learned - 1
    row = table_rows(text_report.markdown(rec), "## Layers")["4"]
    assert row[2:5] == [f"{learned:.3f}", f"{mixed:.3f}", "+0.000"]


def test_baseline_row_gives_fidelity_median_and_p10_each_in_its_column(parked):
    """The baseline row under the layer table: minimax fidelity under the uniform mix,
    median and 10th percentile under theirs, in percent. Distinct values (a record read
    back from elsewhere) show which number went where."""
    base = {**parked["baseline"], "fidelity": 0.3, "fidelity_median": 0.2, "fidelity_p10": 0.1}
    report = text_report.markdown({**parked, "baseline": base})
    row = table_rows(report, "## Layers")["baseline: uniform causal"]
    assert row == ["-", "-", "-", "30.000", "-", "20.000", "10.000", "-", "-", "-"]


def test_best_head_is_the_one_most_sequences_pick_not_the_first_sequences():
    """Sequence 0 reads evenly only with head index 0, sequences 1 and 2 only with index 2:
    the layer row names index 2 (head 3 in the report), the best head of two sequences out
    of three."""
    uniform = np.asarray(graphs.uniform_causal(T))
    eye = np.eye(T)
    first = np.stack([uniform, eye, eye])
    others = np.stack([eye, eye, uniform])
    attn = np.stack([first, others, others]).astype(np.float32)[:, None]
    spec = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False)
    rec = record(spec, attn)
    assert rec["layers"][0]["best_head"].tolist() == [0, 2, 2]
    assert table_rows(text_report.markdown(rec), "## Layers")["1"][0] == "3"


def test_table_without_sink_has_its_own_baseline_and_values():
    """With one sink token, the second layer table reads every layer from the graph
    without it and closes with the baseline of uniform causal attention on T - 1 tokens;
    the sink mass stays the one of the full graph."""
    attn = np.asarray(graphs.random_causal(3, (B, 1, 3), T))  # B x L x H x T x T
    spec = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, sink_tokens=1)
    rec = record(spec, attn)
    full, inner = rec["baseline"]["fidelity"], rec["baseline_without_sink"]["fidelity"]
    assert abs(full - inner) > 1e-3
    report = text_report.markdown(rec)
    rows = table_rows(report, "## Layers without sink")
    assert rows["baseline: uniform causal"][3] == f"{100 * inner:.3f}"
    assert table_rows(report, "## Layers")["baseline: uniform causal"][3] == f"{100 * full:.3f}"
    layer = rec["layers"][0]
    best = 100 * np.mean(layer["without_sink"]["best_head_fidelity"])
    assert abs(best - 100 * np.mean(layer["best_head_fidelity"])) > 1e-3
    assert rows["1"][1] == f"{best:.3f}"
    assert rows["1"][7] == f"{np.mean(layer['sink_mass']):.3f}"


def test_layer_row_gives_uniform_mix_median_and_p10_each_in_its_column(parked):
    """The layer row's 'uniform median' and 'uniform p10' columns are the uniform mix's
    median and 10th percentile of node fidelity, each the mean over sequences in percent.
    Distinct per-sequence values (a record read back from elsewhere) show which number
    went where: medians 40% and 20% average to 30%, p10s 10% and 5% to 7.5%."""
    layer = parked["layers"][0]
    uniform = {
        **layer["mixes"]["uniform"],
        "fidelity_median": np.array([0.4, 0.2]),
        "fidelity_p10": np.array([0.1, 0.05]),
    }
    changed = {**layer, "mixes": {**layer["mixes"], "uniform": uniform}}
    report = text_report.markdown({**parked, "layers": {5: changed}})
    row = table_rows(report, "## Layers")["6"]
    assert row[5:7] == ["30.000", "7.500"]


def test_a_folder_another_process_writes_is_refused_with_nothing_written(parked, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    other = os.open(out / locks.LOCK_FILE, os.O_RDWR | os.O_CREAT)  # as another process's
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(locks.FolderBusy, match=f"{out} is in use by another process"):
            text_report.write(parked, out)
        assert sorted(p.name for p in out.iterdir()) == [locks.LOCK_FILE]
    finally:
        os.close(other)
    names = sorted(p.name for p in text_report.write(parked, out))
    assert names == [
        "analysis.json",
        "fidelity_heads.png",
        "index.html",
        "report.md",
        "sink_share.png",
    ]


def test_a_rerun_without_pairwise_synergy_removes_the_old_plot(parked, tmp_path):
    """A folder holds one analysis: the pairwise plot of an earlier run that asked for it
    goes when a rerun does not, and the other plots are rewritten."""
    heads = np.stack([np.eye(T), np.asarray(graphs.uniform_causal(T)), np.eye(T)])
    attn = np.stack([heads] * B).astype(np.float32)[:, None]
    with_pairs = record(measure.MeasureSpec(horizon=20, max_steps=20), attn)
    first = sorted(p.name for p in text_report.write(with_pairs, tmp_path))
    assert "pairwise_synergy.png" in first
    second = sorted(p.name for p in text_report.write(parked, tmp_path))
    assert "pairwise_synergy.png" not in second
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*second, locks.LOCK_FILE])


def test_per_head_fidelity_plot_numbers_heads_and_layers_from_one(parked):
    """The heatmap's columns are the record's head indices 0, 1, 2, ticked 1, 2, 3; its
    brightest column is index 1, the even-reading head, ticked "2"."""
    plt = files.pyplot()
    fig = text_report.plot_head_fidelity(parked, plt)
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.xaxis.get_ticklabels()] == ["1", "2", "3"]
        assert list(ax.get_xticks()) == [0, 1, 2]
        assert [t.get_text() for t in ax.yaxis.get_ticklabels()] == ["1"]
        grid = ax.images[0].get_array()
        assert int(np.argmax(grid[0])) == 1
    finally:
        plt.close(fig)
