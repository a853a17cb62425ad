"""A layer's flow to the sink: the paper's Example 2 (two heads on u, v, w, tau mixed
0.5 / 0.5) gives each operator's node fidelity, worst tokens 0.375, 0.25 and 5/12."""

import numpy as np
import pytest

from beyondpar import graphs, metrics
from beyondpar.measure import flow

U, V, W, TAU = range(4)
HEAD1 = [(U, V), (V, W), (W, TAU)]
HEAD2 = [(U, W), (V, W), (V, TAU), (W, TAU)]


def test_example_2_heads_and_mix():
    attn = np.stack([np.asarray(graphs.dag_operator(e, 4)) for e in (HEAD1, HEAD2)])
    mixes = {"half": np.array([0.5, 0.5]), "first": np.array([3.0, 0.0])}
    heads, mixed = flow.layer_flows(attn, mixes, horizon=20)
    assert heads.shape == (2, 4) and list(mixed) == ["half", "first"]
    np.testing.assert_allclose(heads.min(-1), [0.375, 0.25], rtol=1e-6)
    assert mixed["half"].min() == pytest.approx(5 / 12, rel=1e-6)
    np.testing.assert_allclose(mixed["first"], heads[0], rtol=1e-6)  # weights renormalised
    want = np.asarray(metrics.node_fidelity(np.asarray(attn, np.float32), 20))
    np.testing.assert_array_equal(heads, want)
