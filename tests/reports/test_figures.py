"""The shared report figures: every layer given gets its own titled heatmap, with readable
head labels at any head count."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from beyondpar.reports import figures  # noqa: E402


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
    """Every head while they fit, every k-th from head 0 beyond: 16 labels once ran into
    each other on a 3-inch panel."""
    fig = figures.pairwise({0: np.zeros((heads, heads)), 3: np.eye(heads)}, plt)
    try:
        for ax in fig.axes[:2]:
            assert list(ax.get_xticks()) == labels and list(ax.get_yticks()) == labels
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
