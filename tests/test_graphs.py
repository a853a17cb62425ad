"""Head mixing, head importance and DAG operators."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs
from beyondpar.base import checks
from helpers.paths import DATA


@pytest.mark.float64
def test_combine_heads_is_weighted_mean():
    attn = graphs.random_causal(0, (2, 3), 6, dtype=np.float64)  # B x H x T x T
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
            r"weights must be non-negative, got minimum -1.0 at index \(1,\)",
        ),
        (
            lambda: graphs.combine_heads(np.ones((2, 2, 2)) / 2, [0, 0]),
            r"weights must not be all zero for any set of heads, got a zero sum$",
        ),
        (
            lambda: graphs.combine_heads(np.ones((3, 2, 2, 2)) / 2, [[1, 1], [1, 0], [0, 0]]),
            r"weights must not be all zero for any set of heads, got a zero sum at index \(2,\)",
        ),
        (
            lambda: graphs.combine_heads(np.ones((2, 2, 2)) / 2, [[1, -1], [-2, 1]]),
            r"weights must be non-negative, got minimum -2.0 at index \(0, 1\)",
        ),
        (
            lambda: graphs.combine_heads(np.ones((2, 2, 2)) / 2, [[1, 1], [1, np.nan]]),
            r"weights must be finite, got NaN or Inf at index \(1, 1\)",
        ),
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


# ---------------------------------------------------------------- rollout


def numpy_rollout(attn_LxHxTxT, weights_LxH, residual):
    t = attn_LxHxTxT.shape[-1]
    r = np.eye(t)
    for a, w in zip(attn_LxHxTxT, weights_LxH, strict=True):
        mixed = np.einsum("h,hij->ij", w / w.sum(), a)
        r = (residual * np.eye(t) + (1 - residual) * mixed) @ r
    return r


def test_rollout_of_identity_attention_is_identity():
    attn = np.broadcast_to(np.eye(6, dtype=np.float32), (3, 2, 6, 6))
    # Both in one program, not a program per operation.
    rollout, sink = jax.jit(lambda a: (graphs.rollout(a), graphs.rollout_sink(a)))(attn)
    np.testing.assert_array_equal(rollout, np.eye(6))
    np.testing.assert_array_equal(sink, np.eye(6)[-1])


def test_one_layer_without_residual_is_the_mixed_heads():
    attn = graphs.random_causal(0, (1, 3), 7)
    w = np.array([[1.0, 2.0, 5.0]], np.float32)
    # Both in one program, not a program per operation.
    both = lambda a, w: (graphs.rollout(a, w, residual=0.0), graphs.combine_heads(a[0], w[0]))
    rollout, mixed = jax.jit(both)(attn, w)
    np.testing.assert_allclose(rollout, mixed, rtol=1e-14)


RESIDUALS = (0.0, 0.3, 0.5)


@jax.jit
def rollouts_and_sink_rows(attn, weights):
    """Each of RESIDUALS' rollout and sink row, in one program (eagerly, a program per
    operation); both models' attention has one shape, so they share it."""
    return [
        (graphs.rollout(attn, weights, r), graphs.rollout_sink(attn, weights, r)) for r in RESIDUALS
    ]


@pytest.mark.float64
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_rollout_matches_numpy_on_pretrained_attention(name):
    attn = np.load(DATA / "hf" / name / "expected.npz")["attention"].astype(np.float64)
    rng = np.random.default_rng(1)
    weights = rng.random(attn.shape[1:3])
    got_by_residual = rollouts_and_sink_rows(attn, weights)
    for residual, (got, sink) in zip(RESIDUALS, got_by_residual, strict=True):
        assert got.dtype == sink.dtype == np.float64
        for b in range(attn.shape[0]):
            ref = numpy_rollout(attn[b], weights, residual)
            np.testing.assert_allclose(got[b], ref, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(np.sum(got, -1), 1.0, rtol=1e-6)  # float32 rows: stochastic
        np.testing.assert_allclose(sink, got[..., -1, :], rtol=1e-10, atol=1e-14)


def mixed_rows_and_products(attn, weights):
    """Each layer's mix, and for residuals 0 and 0.3: the sink's row from the mixes and
    from `rollout_sink`, the running product of `rollout_step` and `rollout` (one program,
    not a program per operation)."""
    mixed = [graphs.combine_heads(attn[:, layer], weights[layer]) for layer in range(3)]
    by_residual = []
    for residual in (0.0, 0.3):
        product = graphs.layer_operator(mixed[0], residual)
        for layer in (1, 2):
            product = graphs.rollout_step(product, graphs.layer_operator(mixed[layer], residual))
        sink = graphs.rollout_sink(attn, weights, residual)
        rollout = graphs.rollout(attn, weights, residual)
        by_residual.append((graphs.rollout_sink_of_mixed(mixed, residual), sink, product, rollout))
    return mixed, by_residual


def test_rollout_from_mixed_layers_and_its_steps_match_the_rollout():
    """The sink's row from the layers' mixes, one layer at a time, is `rollout_sink`'s, and
    the running product of `rollout_step` over the layer operators is `rollout`'s."""
    attn = graphs.random_causal(2, (2, 3, 4), 9)  # B x L x H x T x T, float32
    weights = np.random.default_rng(2).random((3, 4)).astype(np.float32)
    mixed, by_residual = jax.jit(mixed_rows_and_products)(attn, weights)
    for from_mixed, sink, product, rollout in by_residual:
        np.testing.assert_allclose(from_mixed, sink, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(product, rollout, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="mixed_layers must hold at least one layer, got none"):
        graphs.rollout_sink_of_mixed([])
    with pytest.raises(ValueError, match="residual must be a number in"):
        graphs.rollout_sink_of_mixed(mixed, residual=-0.1)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda a: graphs.rollout(a[0]), r"attn must have shape \(..., L, H, T, T\)"),
        (lambda a: graphs.rollout(a, residual=1.5), "residual must be a number in"),
        (
            lambda a: graphs.rollout_sink(a, np.ones((2, 3))),
            r"weights must have shape \(..., L, H\) = \(..., 2, 4\), got shape \(2, 3\)",
        ),
    ],
)
def test_bad_rollout_arguments(call, message):
    attn = np.broadcast_to(np.eye(5), (2, 4, 5, 5))
    with pytest.raises(ValueError, match=message):
        call(attn)


# One program per size and dtype (eagerly, a program per operation).
uniform_causal = jax.jit(graphs.uniform_causal, static_argnums=(0, 1))


@pytest.mark.parametrize("t", [1, 2, 7, 64])
def test_uniform_causal_rows_sum_to_one_and_spread_evenly(t):
    a = np.asarray(uniform_causal(t), np.float64)
    np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-6)
    for i in range(t):
        np.testing.assert_allclose(a[i, : i + 1], 1.0 / (i + 1), rtol=1e-6)
        assert not a[i, i + 1 :].any()


@pytest.mark.parametrize(
    "dtype",
    [jnp.float16, jnp.bfloat16, jnp.float32, pytest.param(jnp.float64, marks=pytest.mark.float64)],
)
def test_uniform_causal_is_built_in_the_dtype_asked_for(dtype):
    """A baseline read against a head in low precision must be in that precision: the
    result has the requested dtype and holds 1 / (i + 1) rounded to it, not a float32 or
    float64 value that would promote whatever it is combined with."""
    a = uniform_causal(6, dtype)
    assert a.dtype == dtype
    want = np.tril(np.ones((6, 6))) / np.arange(1, 7)[:, None]
    np.testing.assert_array_equal(
        np.asarray(a, np.float64), np.asarray(want.astype(dtype), np.float64)
    )


@pytest.mark.float64
def test_drop_sink_tokens_renormalises_each_row_over_the_keys_left():
    """Row i of the graph without the first k tokens is row k + i over keys k.., divided
    by what it puts there; a row that read only the dropped tokens reads itself."""
    attn = graphs.random_causal(2, (2, 3), 7, dtype=np.float64)  # B x H x T x T
    attn[0, 1, 4] = [0.25, 0.75, 0, 0, 0, 0, 0]  # token 4 of one head reads only tokens 0-1
    got = np.asarray(graphs.drop_sink_tokens(attn, 2))
    assert got.shape == (2, 3, 5, 5)
    for b in range(2):
        for h in range(3):
            for i in range(5):
                row = attn[b, h, i + 2, 2:]
                want = row / row.sum() if row.sum() > 0 else np.eye(5)[i]
                np.testing.assert_allclose(got[b, h, i], want, rtol=1e-12, err_msg=(b, h, i))
    np.testing.assert_array_equal(got[0, 1, 2], np.eye(5)[2])
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.triu(got, 1) == 0)  # causal attention stays causal
    np.testing.assert_allclose(graphs.drop_sink_tokens(attn, 0), attn, rtol=1e-12)


@pytest.mark.float64
@pytest.mark.parametrize("t", [1, 5, 9])
def test_sink_mass_of_uniform_causal_attention_has_a_closed_form(t):
    """Under uniform causal attention query i puts min(i + 1, k) / (i + 1) on the first k
    keys, so the sink mass is the mean of that over the T queries, for every k."""
    attn = graphs.uniform_causal(t, dtype=np.float64)
    # Every k in one program (eagerly, each k's slice is a program of its own).
    masses = jax.jit(lambda a: [graphs.sink_mass(a, k) for k in range(1, t + 1)])(attn)
    for k, mass in enumerate(masses, start=1):
        want = np.mean([min(i + 1, k) / (i + 1) for i in range(t)])
        assert mass.dtype == np.float64
        np.testing.assert_allclose(mass, want, rtol=1e-12, err_msg=k)
    np.testing.assert_allclose(masses[t - 1], 1.0, rtol=1e-12)


@pytest.mark.float64
def test_sink_mass_sums_the_first_keys_and_averages_the_queries():
    """Batched heads: each (b, h) reduces to the mean over its queries of the attention on
    keys 0..k-1, checked against hand-computed rows; sinks beyond T or below 1 are errors."""
    attn = np.zeros((2, 3, 3))
    attn[0] = [[1, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]
    attn[1] = [[1, 0, 0], [0, 1, 0], [0, 0.4, 0.6]]
    np.testing.assert_allclose(graphs.sink_mass(attn), [(1 + 0.5 + 0.2) / 3, 1 / 3], rtol=1e-12)
    np.testing.assert_allclose(
        graphs.sink_mass(attn, sink_tokens=2), [(1 + 1 + 0.5) / 3, (1 + 1 + 0.4) / 3], rtol=1e-12
    )
    heads = graphs.random_causal(3, (2, 4), 6, dtype=np.float64)
    got = np.asarray(graphs.sink_mass(heads, sink_tokens=3))
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, heads[..., :3].sum(-1).mean(-1), rtol=1e-12)
    with pytest.raises(ValueError, match="sink_tokens must be at most T=3, got 4"):
        graphs.sink_mass(attn, 4)
    with pytest.raises(ValueError, match="sink_tokens must be an integer >= 1, got 0"):
        graphs.sink_mass(attn, 0)


@pytest.mark.parametrize("shape", [(), (4,), (2, 3), (5, 4, 3)])
@pytest.mark.parametrize("function", [graphs.sink_mass, graphs.drop_sink_tokens])
def test_sink_token_functions_name_attention_that_is_not_square_matrices(function, shape):
    """A scalar, a vector or rectangular matrices are not attention over T tokens: the
    error names the argument and the shape it got, not an index past the shape."""
    attn = np.full(shape, 0.5)
    with pytest.raises(
        ValueError,
        match=re.escape(f"attn must have shape (..., T, T) with square matrices, got {shape}"),
    ):
        function(attn, 1)


@pytest.mark.float64
def test_drop_sink_tokens_takes_k_from_0_to_t_minus_2_and_nothing_else():
    """At most T - 2 tokens go (two must stay for a graph with a sink and one more
    token); a negative count, T - 1, or a boolean is an error naming the argument."""
    attn = np.asarray(graphs.uniform_causal(4, np.float64))
    kept = np.asarray(graphs.drop_sink_tokens(attn, 2))
    np.testing.assert_allclose(kept, [[1.0, 0.0], [0.5, 0.5]], rtol=1e-12)
    for k in (-1, 3, 4):
        with pytest.raises(
            ValueError, match=re.escape(f"sink_tokens must be in [0, 3) for T=4 tokens, got {k}")
        ):
            graphs.drop_sink_tokens(attn, k)
    with pytest.raises(ValueError, match="sink_tokens must be an integer, got True"):
        graphs.drop_sink_tokens(attn, True)


def test_float64_attention_in_float32_mode_is_named_before_it_is_rounded(monkeypatch):
    """In JAX's float32 mode a float64 array is computed in float32: the sink-token
    functions say so, naming the argument, as every operator entry point does."""
    with jax.enable_x64(False):
        for function in (graphs.sink_mass, graphs.drop_sink_tokens):
            monkeypatch.setattr(checks, "_warned_float64", False)  # said once per process
            with pytest.warns(UserWarning, match="attn is float64 but JAX runs in float32 mode"):
                out = function(np.eye(3), 1)
            assert out.dtype == np.float32
