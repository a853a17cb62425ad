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


def _causal_attention(seed, heads, tokens):
    """Random causal row-stochastic attention (heads, tokens, tokens), float64."""
    rng = np.random.default_rng(seed)
    weights = np.exp(rng.normal(size=(heads, tokens, tokens)))
    weights = np.where(np.tril(np.ones((tokens, tokens), bool)), weights, 0.0)
    return weights / weights.sum(-1, keepdims=True)


def _brute_node_fidelity(c_TxT, horizon):
    """phi_j = max_{1<=t<=horizon} (e_sink^T C^t)[j], the sink the last token, in float64."""
    s = np.eye(c_TxT.shape[-1])[-1]
    best = np.full(c_TxT.shape[-1], -np.inf)
    for _ in range(horizon):
        s = s @ c_TxT
        best = np.maximum(best, s)
    return best


def test_layer_flows_match_brute_force_for_heads_and_each_named_mix():
    attn = _causal_attention(7, heads=3, tokens=6)
    mixes = {"b": np.array([0.7, 0.2, 0.1]), "a": np.array([0.1, 0.3, 0.6])}
    horizon = 3
    heads, mixed = flow.layer_flows(attn, mixes, horizon)
    assert heads.shape == (3, 6)
    want = np.stack([_brute_node_fidelity(a, horizon) for a in attn])
    np.testing.assert_allclose(heads, want, atol=1e-5)
    assert list(mixed) == ["b", "a"]
    for name, w in mixes.items():
        c = np.einsum("h,hij->ij", w, attn)
        np.testing.assert_allclose(mixed[name], _brute_node_fidelity(c, horizon), atol=1e-5)
    # The first token only attends to itself, so its flow grows with every step: the
    # horizon is used exactly.
    assert heads[0, 0] > _brute_node_fidelity(attn[0], horizon - 1)[0] + 1e-3


def test_layer_flows_without_mixes_is_each_heads_flow():
    attn = _causal_attention(3, heads=2, tokens=5)
    heads, mixed = flow.layer_flows(attn, {}, 4)
    assert mixed == {}
    want = np.stack([_brute_node_fidelity(a, 4) for a in attn])
    np.testing.assert_allclose(heads, want, atol=1e-5)
