"""Permutation-sampled Shapley values against the exact ones, where both run."""

import jax
import numpy as np
import pytest

from beyondpar import coalitions, graphs


def test_orders_are_permutations():
    order = coalitions.orders(jax.random.PRNGKey(0), 5, 7)
    assert order.shape == (7, 5)
    np.testing.assert_array_equal(np.sort(order, axis=1), np.tile(np.arange(5), (7, 1)))


def test_sampled_agrees_with_exact_on_eight_heads():
    """Within 4 standard errors per head; and efficiency holds order by order."""
    attn = graphs.random_causal(0, (2, 8), 10)
    fn = coalitions.mix_value_fn(attn, np.arange(1.0, 9.0), horizon=40)
    v = coalitions.values(value_fn=fn)
    exact = np.asarray(coalitions.shapley(v))
    mean, stderr = coalitions.sampled_shapley(fn, 8, 200, jax.random.PRNGKey(1))
    assert mean.shape == stderr.shape == (2, 8)
    assert np.all(stderr > 0)
    np.testing.assert_array_less(np.abs(mean - exact), 4 * stderr + 1e-6)
    np.testing.assert_allclose(mean.sum(-1), v[:, -1] - v[:, 0], rtol=1e-4, atol=1e-5)


def test_shapley_values_exact_or_sampled():
    attn = graphs.random_causal(1, (1, 4), 8)
    phi, stderr = coalitions.shapley_values(attn, objective="hitting_time", horizon=30)
    np.testing.assert_allclose(
        phi,
        coalitions.shapley(coalitions.values(attn, objective="hitting_time", horizon=30)),
        rtol=1e-6,
    )
    np.testing.assert_array_equal(stderr, 0)
    key = jax.random.PRNGKey(2)
    mean, se = coalitions.shapley_values(attn, samples=50, key=key, horizon=30)
    fn = coalitions.mix_value_fn(attn, horizon=30)
    again = coalitions.sampled_shapley(fn, 4, 50, key)
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


def test_one_order_has_no_spread():
    attn = graphs.random_causal(2, (1, 3), 6)
    mean, stderr = coalitions.sampled_shapley(
        coalitions.mix_value_fn(attn), 3, 1, jax.random.PRNGKey(0)
    )
    np.testing.assert_array_equal(stderr, 0)
    assert mean.shape == (1, 3)


def test_antithetic_orders_agree_with_exact():
    attn = graphs.random_causal(3, (1, 6), 10)
    fn = coalitions.mix_value_fn(attn, horizon=40)
    exact = np.asarray(coalitions.shapley(coalitions.values(value_fn=fn)))
    mean, stderr = coalitions.sampled_shapley(fn, 6, 100, jax.random.PRNGKey(4), antithetic=True)
    np.testing.assert_array_less(np.abs(mean - exact), 4 * stderr + 1e-6)
    with pytest.raises(ValueError, match="permutations must be even"):
        coalitions.sampled_shapley(fn, 6, 3, jax.random.PRNGKey(4), antithetic=True)
