"""The value of every coalition of heads: against each coalition's mix measured alone by
the metric kernels, the paper's Example 2, and the axioms on attention."""

import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import coalitions, graphs, metrics
from beyondpar.study import worked_example

# The games below share one shape (2 sequences of 5 heads of 9 tokens) and one horizon:
# each shape, horizon, objective and walk is a program of the coalition kernel.
B, H, T = 2, 5, 9
HORIZON = 30


def _mix(attn_BxHxTxT, members, weights_BxH=None):
    """The coalition's mix formed in NumPy (float64, returned in the attention's dtype):
    its members' weights (uniform when None) renormalised over them."""
    a = np.asarray(attn_BxHxTxT)[:, members].astype(np.float64)
    w = np.ones(a.shape[:2]) if weights_BxH is None else np.asarray(weights_BxH)[:, members]
    w = w / w.sum(-1, keepdims=True)
    return np.einsum("bh,bhij->bij", w, a).astype(attn_BxHxTxT.dtype)


def _example_two():
    ops = worked_example.operators()
    return jnp.stack([ops["head1"], ops["head2"]])[None]  # 1 x 2 x 4 x 4


def test_example_two_values_and_shapley():
    """v = (0, 3/8, 1/4, 5/12): the heads alone and mixed 50/50 (the paper's numbers)."""
    v = coalitions.values(_example_two())
    np.testing.assert_allclose(v, [[0, 3 / 8, 1 / 4, 5 / 12]], atol=1e-6)
    np.testing.assert_allclose(coalitions.shapley(v), [[13 / 48, 7 / 48]], atol=1e-6)
    np.testing.assert_allclose(coalitions.harsanyi(v)[:, 3], [-5 / 24], atol=1e-6)


@pytest.mark.parametrize("objective", ["fidelity", "hitting_time"])
@pytest.mark.parametrize("walk", ["reference", "normalized"])
def test_values_are_each_mix_measured_alone(objective, walk):
    attn = graphs.random_causal(0, (B, H), T)  # B x H x T x T
    weights = np.array([[1.0, 2.0, 0.5, 1.0, 0.7], [0.2, 1.0, 1.0, 3.0, 0.4]], np.float32)
    horizon = HORIZON
    got = coalitions.values(attn, weights, objective, horizon=horizon, walk=walk)
    assert got.shape == (B, 32) and got.dtype == np.float32
    for c in range(32):
        members = [h for h in range(H) if c >> h & 1]
        if not members:
            mix = jnp.broadcast_to(jnp.eye(T), (B, T, T))  # the empty coalition: identity
        else:
            mix = _mix(attn, members, weights)
        if objective == "fidelity":
            want = metrics.minimax_fidelity(mix, horizon)
        else:
            want = metrics.hitting_time(mix, horizon, walk)
        np.testing.assert_allclose(got[:, c], want, rtol=1e-5, atol=1e-6, err_msg=f"{c}")


def test_empty_coalition_values():
    assert coalitions.empty_value("fidelity", 9, 100) == 0
    assert coalitions.empty_value("hitting_time", 4, 100) == 75  # 100 (T - 1) / T
    attn = graphs.random_causal(1, (B, H), T)  # the program of the hitting times above
    v = coalitions.values(attn, objective="hitting_time", horizon=HORIZON)
    np.testing.assert_allclose(v[:, 0], HORIZON * (T - 1) / T)


def test_uniform_weights_are_the_default_and_shared_weights_broadcast():
    attn = graphs.random_causal(1, (B, H), T)
    uniform = coalitions.values(attn, horizon=HORIZON)
    np.testing.assert_allclose(coalitions.values(attn, np.ones(H), horizon=HORIZON), uniform)
    shared = coalitions.values(attn, np.ones((B, H)), horizon=HORIZON)
    np.testing.assert_allclose(shared, uniform, rtol=1e-6)
    weighted = coalitions.values(attn, np.arange(1.0, H + 1), horizon=HORIZON)
    assert np.abs(weighted - uniform).max() > 1e-4  # the weights do change the mixes


def test_small_blocks_give_the_same_values():
    """Blocks of a memory budget, the last padded to the common shape."""
    attn = graphs.random_causal(2, (B, H), T)
    whole = coalitions.values(attn, horizon=HORIZON)
    fn = coalitions.mix_value_fn(attn, horizon=HORIZON, block_size=3)
    np.testing.assert_allclose(coalitions.values(value_fn=fn), whole, rtol=1e-6)
    # Repeats, the empty coalition and 27 others: the 27 mixes padded to 48, as all 31
    # are in the table test below (its program).
    asked = [31, 0, 4, 7, 4, *range(8, 31)]
    masks = coalitions.coalition_masks(5)[asked]
    np.testing.assert_allclose(fn(masks), whole[:, asked], rtol=1e-6)


def test_axioms_on_attention():
    """Efficiency; two copies of one head get equal values; a head of weight 0 gets 0 and
    interacts with no one."""
    attn = graphs.random_causal(3, (B, H), T)
    attn[:, 1] = attn[:, 0]
    weights = np.array([1.0, 1.0, 2.0, 0.0, 0.5])
    for objective in ("fidelity", "hitting_time"):
        v = coalitions.values(attn, weights, objective, HORIZON)
        phi = np.asarray(coalitions.shapley(v))
        np.testing.assert_allclose(phi.sum(-1), v[:, -1] - v[:, 0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(phi[:, 0], phi[:, 1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(phi[:, 3], 0, atol=1e-6)
        np.testing.assert_allclose(np.asarray(coalitions.interaction(v))[:, 3], 0, atol=1e-6)


def test_a_value_fn_stands_in_for_attention():
    attn = graphs.random_causal(4, (B, H), T)
    fn = coalitions.mix_value_fn(attn, objective="hitting_time", horizon=HORIZON)
    assert fn.num_heads == H
    np.testing.assert_array_equal(
        coalitions.values(value_fn=fn),
        coalitions.values(attn, objective="hitting_time", horizon=HORIZON),
    )
    table = np.arange(8, dtype=np.float32)[None]
    plain = lambda masks: table[:, np.asarray(masks, int) @ np.array([1, 2, 4])]  # noqa: E731
    np.testing.assert_array_equal(coalitions.values(value_fn=plain, num_heads=3), table)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(weights_H=np.ones(2)), "weights_H must have shape \\(3,\\) or \\(2, 3\\)"),
        (dict(weights_H=np.array([1.0, -1.0, 1.0])), "weights_H must be finite, non-negative"),
        (dict(objective="loss"), "objective"),
        (dict(horizon=0), "horizon"),
        (dict(walk="lazy"), "walk"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        coalitions.values(graphs.random_causal(5, (2, 3), 5), **kwargs)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="attn_BxHxTxT must have shape \\(B, H, T, T\\)"):
        coalitions.values(graphs.random_causal(5, (3,), 5))
    with pytest.raises(ValueError, match="num_heads must be at most 16"):
        coalitions.values(value_fn=lambda m: np.zeros((1, len(m))), num_heads=17)
    with pytest.raises(ValueError, match="needs attn_BxHxTxT or value_fn"):
        coalitions.values()
    fn = coalitions.mix_value_fn(graphs.random_causal(5, (1, 3), 5))
    with pytest.raises(ValueError, match="masks_KxH must be a \\(K, 3\\) array of 0/1"):
        fn(np.full((2, 3), 0.5))


@pytest.mark.parametrize("causal", [True, False])
def test_long_and_non_causal_attention(causal):
    """Past the kernels' triangular threshold (64 tokens), and on attention that reads
    later tokens too (no early stop of the fidelity)."""
    t = 70 if causal else T
    attn = graphs.random_causal(6, (B, H), t)
    if not causal:
        attn = np.random.default_rng(6).dirichlet(np.ones(t), (B, H, t)).astype(np.float32)
    for objective, measure in [
        ("fidelity", lambda c: metrics.minimax_fidelity(c, HORIZON)),
        ("hitting_time", lambda c: metrics.hitting_time(c, HORIZON, "reference")),
    ]:
        v = coalitions.values(attn, objective=objective, horizon=HORIZON)
        for c in (1, 5, 7, 26):
            members = [h for h in range(H) if c >> h & 1]
            want = measure(_mix(attn, members))
            np.testing.assert_allclose(v[:, c], want, rtol=2e-5, atol=1e-6, err_msg=objective)


def test_the_table_and_the_mask_batches_agree():
    """`every_coalition` (high and low parts of the index) against calls on masks, with a
    weightless head and per-sequence weights."""
    attn = graphs.random_causal(7, (B, H), T)
    weights = np.array([[1.0, 0.0, 2.0, 1.0, 0.5], [0.0, 1.0, 1.0, 3.0, 1.0]])
    for block in (1, 3, 64):  # 3: the blocks above (one low bit, a slot left over)
        fn = coalitions.mix_value_fn(attn, weights, horizon=HORIZON, block_size=block)
        np.testing.assert_allclose(
            fn.every_coalition(), fn(coalitions.coalition_masks(5)), rtol=1e-6, atol=1e-7
        )


@pytest.mark.float64
def test_float64_attention_gives_float64_values_of_each_mix():
    attn = graphs.random_causal(8, (2, 3), 7, dtype=np.float64)
    v = coalitions.values(attn, objective="hitting_time", horizon=40)
    assert v.dtype == np.float64
    for c in range(1, 8):
        members = [h for h in range(3) if c >> h & 1]
        want = metrics.hitting_time(_mix(attn, members), 40, "reference")
        np.testing.assert_allclose(v[:, c], want, rtol=1e-12)
