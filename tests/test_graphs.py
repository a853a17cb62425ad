"""Head mixing, head importance and DAG operators."""

import numpy as np
import pytest

from beyondpar import benchmarks, graphs


def test_combine_heads_is_weighted_mean():
    attn = benchmarks.random_causal_attention(0, (2, 3), 6, dtype=np.float64)  # B x H x T x T
    w = np.array([[1.0, 2.0, 1.0], [0.0, 0.0, 5.0]])
    got = np.asarray(graphs.combine_heads(attn, w))
    np.testing.assert_allclose(got[0], (attn[0, 0] + 2 * attn[0, 1] + attn[0, 2]) / 4)
    np.testing.assert_allclose(got[1], attn[1, 2])
    np.testing.assert_allclose(graphs.combine_heads(attn), attn.mean(1))
    np.testing.assert_allclose(got.sum(-1), 1.0)
    assert np.all(np.triu(got, 1) == 0)


def test_head_importance_blocks_rows():
    kernel = np.zeros((8, 3))
    kernel[2:4] = 1.0  # head 1 of 4 owns rows 2..3
    kernel[6, 0] = 3.0
    np.testing.assert_allclose(graphs.head_importance(kernel, 4), [0, np.sqrt(6), 0, 3])


def test_dag_operator_rows_are_receivers():
    c = np.asarray(graphs.dag_operator([(0, 1), (0, 2), (1, 2)], 3))
    np.testing.assert_allclose(c, [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])
    swap = graphs.dag_operator([(0, 1), (1, 0)], 2, self_loops=False)
    np.testing.assert_allclose(swap, [[0, 1], [1, 0]])


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: graphs.combine_heads(np.ones((2, 2))),
            r"attn must have shape \(\.\.\., H, T, T\)",
        ),
        (
            lambda: graphs.combine_heads(np.ones((3, 2, 2)) / 2, [1, 1]),
            r"weights must have last dimension num_heads=3, got shape \(2,\)",
        ),
        (
            lambda: graphs.combine_heads(np.ones((2, 2, 2)) / 2, [1, -1]),
            "weights must be non-negative, got minimum -1.0",
        ),
        (lambda: graphs.combine_heads(np.ones((2, 2, 2)) / 2, [0, 0]), "must not be all zero"),
        (lambda: graphs.combine_heads(np.ones((2, 2, 2)) / 2, [np.nan, 1]), "finite"),
        (lambda: graphs.head_importance(np.ones((6, 6)), 4), "num_heads must divide .* 6, got 4"),
        (lambda: graphs.head_importance(np.ones(6), 2), r"2-D Dense kernel, got shape \(6,\)"),
        (lambda: graphs.head_importance(np.ones((6, 6)), 0), "num_heads must be an integer >= 1"),
        (lambda: graphs.dag_operator([(0, 3)], 3), r"edge node must be in \[0, 3\), got 3"),
        (lambda: graphs.dag_operator([(0, 1, 2)], 3), "edges must be .sender, receiver. pairs"),
        (lambda: graphs.dag_operator([], 2, self_loops=False), "needs an incoming edge"),
        (lambda: graphs.dag_operator([], 0), "num_nodes must be an integer >= 1, got 0"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
