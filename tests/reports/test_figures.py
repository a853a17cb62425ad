"""The shared report figures: every layer given gets its own titled heatmap."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from beyondpar.reports import figures  # noqa: E402


@pytest.mark.parametrize("num_layers", [1, 4, 5, 9])
def test_pairwise_draws_a_panel_for_every_layer(num_layers):
    mats = {k: np.full((3, 3), float(k)) for k in range(num_layers)}
    fig = figures.pairwise(mats, plt)
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles == [f"layer {k + 1}" for k in range(num_layers)]
    finally:
        plt.close(fig)
