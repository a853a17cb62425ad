"""The shared report figures: every layer given gets its own titled heatmap, with readable
head labels at any head count."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from beyondpar.reports import figures  # noqa: E402


def tick_texts(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels()]


@pytest.mark.parametrize(
    "heads, labels",
    [
        (1, [0]),
        (9, list(range(9))),
        (10, list(range(10))),
        (11, [0, 2, 4, 6, 8, 10]),
        (16, [0, 2, 4, 6, 8, 10, 12, 14]),
        (32, [0, 4, 8, 12, 16, 20, 24, 28]),
    ],
)
def test_pairwise_heatmaps_label_at_most_ten_heads_an_axis(heads, labels):
    """Every head while they fit, every k-th from the first beyond: 16 labels once ran into
    each other on a 3-inch panel. The ticks sit at the 0-based indices and read from 1."""
    fig = figures.pairwise({0: np.zeros((heads, heads)), 3: np.eye(heads)}, plt)
    try:
        for ax in fig.axes[:2]:
            assert list(ax.get_xticks()) == labels and list(ax.get_yticks()) == labels
            assert tick_texts(ax.xaxis) == tick_texts(ax.yaxis) == [str(h + 1) for h in labels]
        assert [ax.get_title() for ax in fig.axes[:2]] == ["layer 1", "layer 4"]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("num_layers", [1, 4, 5, 9])
def test_pairwise_draws_a_panel_for_every_layer(num_layers):
    mats = {k: np.full((3, 3), float(k)) for k in range(num_layers)}
    fig = figures.pairwise(mats, plt)
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles == [f"layer {k + 1}" for k in range(num_layers)]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("draw", ["pairwise", "interaction"])
def test_both_head_heatmaps_number_heads_from_one(draw):
    """Three heads read 1, 2, 3 on both axes of the pairwise-synergy and the interaction
    heatmaps alike (the pairwise one once read 0, 1, 2)."""
    mats = {1: np.arange(9.0).reshape(3, 3)}
    fig = figures.pairwise(mats, plt) if draw == "pairwise" else figures.interaction(mats, plt, "x")
    try:
        ax = fig.axes[0]
        assert tick_texts(ax.xaxis) == tick_texts(ax.yaxis) == ["1", "2", "3"]
        assert list(ax.get_xticks()) == [0, 1, 2]  # the matrix's own 0-based columns
        assert ax.get_title() == "layer 2"
    finally:
        plt.close(fig)
