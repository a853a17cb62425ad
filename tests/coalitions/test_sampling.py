"""Permutation-sampled Shapley values against the exact ones, where both run."""

import jax
import numpy as np
import pytest

from beyondpar import coalitions, graphs

# The games below share one layer (2 sequences of 8 heads of 10 tokens), one horizon and
# one count of drawn orders: each shape, horizon, objective and order count is a program
# (the mixes of any game of these heads are measured in blocks of one shape).
H, ORDERS = 8, 200


@pytest.fixture(scope="module")
def game():
    """(attention, its fidelity game with weights 1..8, every coalition's value)."""
    attn = graphs.random_causal(0, (2, H), 10)
    fn = coalitions.mix_value_fn(attn, np.arange(1.0, H + 1), horizon=40)
    return attn, fn, coalitions.values(value_fn=fn)


def test_orders_are_permutations():
    order = coalitions.orders(jax.random.PRNGKey(0), H, ORDERS)
    assert order.shape == (ORDERS, H)
    np.testing.assert_array_equal(np.sort(order, axis=1), np.tile(np.arange(H), (ORDERS, 1)))


def test_sampled_agrees_with_exact_on_eight_heads(game):
    """Within 4 standard errors per head; and efficiency holds order by order."""
    _, fn, v = game
    exact = np.asarray(coalitions.shapley(v))
    mean, stderr = coalitions.sampled_shapley(fn, H, ORDERS, jax.random.PRNGKey(1))
    assert mean.shape == stderr.shape == (2, 8)
    assert np.all(stderr > 0)
    np.testing.assert_array_less(np.abs(mean - exact), 4 * stderr + 1e-6)
    np.testing.assert_allclose(mean.sum(-1), v[:, -1] - v[:, 0], rtol=1e-4, atol=1e-5)


def test_shapley_values_exact_or_sampled(game):
    attn = game[0]
    phi, stderr = coalitions.shapley_values(attn, objective="hitting_time", horizon=40)
    np.testing.assert_allclose(
        phi,
        coalitions.shapley(coalitions.values(attn, objective="hitting_time", horizon=40)),
        rtol=1e-6,
    )
    np.testing.assert_array_equal(stderr, 0)
    key = jax.random.PRNGKey(2)
    mean, se = coalitions.shapley_values(attn, samples=ORDERS, key=key, horizon=40)
    fn = coalitions.mix_value_fn(attn, horizon=40)
    again = coalitions.sampled_shapley(fn, H, ORDERS, key)
    np.testing.assert_array_equal(mean, again[0])
    np.testing.assert_array_equal(se, again[1])


def test_more_heads_than_every_coalition_allows_need_samples():
    def fn(masks):  # an additive game: head h is worth h
        return (np.asarray(masks) @ np.arange(20.0))[None]

    with pytest.raises(ValueError, match="samples must be given for more than 16 heads"):
        coalitions.shapley_values(value_fn=fn, num_heads=20)
    mean, stderr = coalitions.shapley_values(value_fn=fn, num_heads=20, samples=3)
    np.testing.assert_allclose(mean, np.arange(20.0)[None], atol=1e-9)
    np.testing.assert_allclose(stderr, 0, atol=1e-9)


def test_one_order_has_no_spread(game):
    mean, stderr = coalitions.sampled_shapley(game[1], H, 1, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(stderr, 0)
    assert mean.shape == (2, H)


def test_antithetic_orders_agree_with_exact(game):
    """Reversed orders: ORDERS pairs drawn as the ORDERS orders above."""
    _, fn, v = game
    exact = np.asarray(coalitions.shapley(v))
    key = jax.random.PRNGKey(4)
    mean, stderr = coalitions.sampled_shapley(fn, H, 2 * ORDERS, key, antithetic=True)
    np.testing.assert_array_less(np.abs(mean - exact), 4 * stderr + 1e-6)
    with pytest.raises(ValueError, match="permutations must be even"):
        coalitions.sampled_shapley(fn, H, 3, key, antithetic=True)
