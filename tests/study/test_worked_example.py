"""The paper's Example 2 / Figure 3, and its launcher's files."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beyondpar import metrics
from beyondpar.study import worked_example

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.float64
@pytest.mark.parametrize("horizon", [20, 100])
def test_minimax_fidelity(horizon):
    ops = worked_example.operators()
    got = {name: float(metrics.minimax_fidelity(op, horizon)) for name, op in ops.items()}
    np.testing.assert_allclose(got["head1"], 0.375, rtol=1e-12)
    # Head 2's source u approaches 1/4 from below: 0.2499999971 after 20 steps.
    np.testing.assert_allclose(got["head2"], 0.25, rtol=1e-12 if horizon == 100 else 2e-8)
    assert got["head2"] <= 0.25
    np.testing.assert_allclose(got["mixed"], 5 / 12, rtol=1e-12)


def test_sink_signal_values():
    ops = worked_example.operators()
    mixed_t3 = np.asarray(metrics.sink_signal(ops["mixed"], 3))[2, :3]
    np.testing.assert_allclose(mixed_t3.round(4), [0.2610, 0.4497, 0.2170])
    head1_t4 = np.asarray(metrics.sink_signal(ops["head1"], 4))[3, :3]
    np.testing.assert_allclose(head1_t4, [0.3125, 0.375, 0.25], rtol=1e-12)


def test_launcher_writes_figures_and_summary(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "example2.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "41.67%" in out and "37.50%" in out and "25.00%" in out
    for name in ("head1", "head2", "mixed"):
        png = (tmp_path / f"example2_{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    summary = json.loads((tmp_path / "example2.json").read_text())
    assert summary["mixed"]["minimax_fidelity"] == pytest.approx(5 / 12, rel=1e-12)
    assert summary["head1"]["node_fidelity"]["v"] == pytest.approx(0.375, rel=1e-12)
    page = (tmp_path / "index.html").read_text()
    assert '<select id="head"' in page and "Example 2" in page
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_figure_keeps_the_legend_off_the_curves_and_ticks_t1():
    import matplotlib.pyplot as plt

    fig = worked_example.plot_operator("mixed", worked_example.operators()["mixed"])
    ax = fig.axes[0]
    assert ax.get_xticks()[0] == 1
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the plotting area
    plt.close(fig)


# Example 2's heads built by hand: rows are receivers, each row averages the node's own
# self-loop and the senders that feed it.
HEAD1 = np.array([[1, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [0, 1 / 2, 1 / 2, 0], [0, 0, 1 / 2, 1 / 2]])
HEAD2 = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [0, 1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.float64
@pytest.mark.parametrize("mix", [(1.0, 0.0), (0.0, 1.0), (0.25, 0.75)])
def test_mixture_weights_apply_to_heads_in_order(mix):
    """The first mixture weight scales head 1 and the second head 2: an all-on-one-head
    mix reproduces that head (37.5% or 25% minimax fidelity), and an uneven mix is the
    weighted sum of the two hand-built operators."""
    ops = worked_example.operators(mix)
    np.testing.assert_allclose(ops["head1"], HEAD1, rtol=1e-12)
    np.testing.assert_allclose(ops["head2"], HEAD2, rtol=1e-12)
    np.testing.assert_allclose(ops["mixed"], mix[0] * HEAD1 + mix[1] * HEAD2, rtol=1e-12)
    if mix[1] == 0.0:
        assert float(metrics.minimax_fidelity(ops["mixed"], 100)) == pytest.approx(0.375)
    if mix[0] == 0.0:
        assert float(metrics.minimax_fidelity(ops["mixed"], 100)) == pytest.approx(0.25)
