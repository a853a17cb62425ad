"""The transforms of a table of coalition values, against their definitions summed over
subsets in float64, and the axioms that pin Shapley values."""

import itertools
import math

import jax
import numpy as np
import pytest

from beyondpar import coalitions


def _members(c: int, h: int) -> frozenset:
    return frozenset(i for i in range(h) if c >> i & 1)


def _index(members) -> int:
    return sum(1 << i for i in members)


def _random_game(seed: int, h: int, batch: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 2**h))


def test_masks_are_bitmasks():
    masks = coalitions.coalition_masks(3)
    assert masks.shape == (8, 3)
    np.testing.assert_array_equal(masks[5], [1, 0, 1])  # 5 = 0b101: heads 0 and 2
    np.testing.assert_array_equal(coalitions.coalition_sizes(3), [0, 1, 1, 2, 1, 2, 2, 3])


def test_example_two_closed_form():
    """The paper's Example 2 as a game: v({}) = 0, v({0}) = 3/8, v({1}) = 1/4,
    v({0, 1}) = 5/12. By hand: phi_0 = (3/8 + (5/12 - 1/4)) / 2 = 13/48, phi_1 =
    (1/4 + (5/12 - 3/8)) / 2 = 7/48, the pair's dividend 5/12 - 3/8 - 1/4 = -5/24."""
    v = np.array([[0.0, 3 / 8, 1 / 4, 5 / 12]], np.float32)
    np.testing.assert_allclose(coalitions.shapley(v), [[13 / 48, 7 / 48]], atol=1e-6)
    np.testing.assert_allclose(coalitions.harsanyi(v), [[0, 3 / 8, 1 / 4, -5 / 24]], atol=1e-6)
    np.testing.assert_allclose(
        coalitions.interaction(v), [[[13 / 48, -5 / 24], [-5 / 24, 7 / 48]]], atol=1e-6
    )


@pytest.mark.float64
@pytest.mark.parametrize("h", [1, 3, 5])
def test_harsanyi_is_the_signed_sum_over_subsets_and_zeta_inverts_it(h):
    v = _random_game(h, h)
    d = np.asarray(coalitions.harsanyi(v))
    expected = np.zeros_like(v)
    for c in range(2**h):
        s = _members(c, h)
        for k in range(len(s) + 1):
            for t in itertools.combinations(sorted(s), k):
                expected[:, c] += (-1) ** (len(s) - k) * v[:, _index(t)]
    np.testing.assert_allclose(d, expected, atol=1e-12)
    np.testing.assert_allclose(coalitions.zeta(d), v, atol=1e-12)


@pytest.mark.float64
@pytest.mark.parametrize("h", [2, 4, 5])
def test_shapley_is_the_subset_formula(h):
    v = _random_game(10 + h, h)
    expected = np.zeros((v.shape[0], h))
    for i in range(h):
        for c in range(2**h):
            s = _members(c, h)
            if i in s:
                continue
            weight = math.factorial(len(s)) * math.factorial(h - len(s) - 1) / math.factorial(h)
            expected[:, i] += weight * (v[:, c | 1 << i] - v[:, c])
    np.testing.assert_allclose(coalitions.shapley(v), expected, atol=1e-12)


@pytest.mark.float64
@pytest.mark.parametrize("h", [2, 3, 5])
def test_interaction_is_the_grabisch_formula(h):
    """I_ij = sum_{S without i, j} |S|! (n - |S| - 2)! / (n - 1)! (v(S+ij) - v(S+i) -
    v(S+j) + v(S)); the diagonal holds the Shapley values."""
    v = _random_game(20 + h, h)
    expected = np.zeros((v.shape[0], h, h))
    for i, j in itertools.permutations(range(h), 2):
        for c in range(2**h):
            s = _members(c, h)
            if i in s or j in s:
                continue
            weight = math.factorial(len(s)) * math.factorial(h - len(s) - 2)
            weight /= math.factorial(h - 1)
            delta = v[:, c | 1 << i | 1 << j] - v[:, c | 1 << i] - v[:, c | 1 << j] + v[:, c]
            expected[:, i, j] += weight * delta
    idx = np.arange(h)
    expected[:, idx, idx] = coalitions.shapley(v)
    np.testing.assert_allclose(coalitions.interaction(v), expected, atol=1e-12)


def test_efficiency_symmetry_and_null_player_on_a_game():
    """Head 3 never changes the value (null); heads 0 and 1 are interchangeable."""
    h = 4
    rng = np.random.default_rng(0)
    base = rng.standard_normal((1, 2**h)).astype(np.float32)
    masks = coalitions.coalition_masks(h).astype(int)
    swapped = masks[:, [1, 0, 2, 3]] @ (1 << np.arange(h))
    no_null = masks[:, [0, 1, 2]] @ (1 << np.arange(3))
    v = base[:, no_null]  # independent of head 3
    v = (v + v[:, swapped]) / 2  # symmetric in heads 0 and 1
    phi = np.asarray(coalitions.shapley(v))
    np.testing.assert_allclose(phi.sum(-1), v[:, -1] - v[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(phi[:, 0], phi[:, 1], rtol=1e-6)
    np.testing.assert_allclose(phi[:, 3], 0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(coalitions.interaction(v))[:, 3], 0, atol=1e-6)


def test_any_leading_axes():
    v = _random_game(3, 3, batch=6).reshape(2, 3, 8).astype(np.float32)
    assert coalitions.shapley(v).shape == (2, 3, 3)
    assert coalitions.harsanyi(v).shape == (2, 3, 8)
    assert coalitions.interaction(v).shape == (2, 3, 3, 3)


@pytest.mark.parametrize("shape", [(3,), (2, 6), (1,), ()])
def test_a_table_that_is_not_two_to_the_heads_is_refused(shape):
    with pytest.raises(ValueError, match="values_BxC must end in an axis of 2\\^H"):
        coalitions.shapley(np.zeros(shape, np.float32))


def test_sampled_matches_a_table_game_exactly_with_every_order_of_two_heads():
    v = np.array([[0.0, 3 / 8, 1 / 4, 5 / 12]], np.float32)

    def value_fn(masks):
        return v[:, np.asarray(masks, int) @ np.array([1, 2])]

    mean, stderr = coalitions.sampled_shapley(value_fn, 2, 64, jax.random.PRNGKey(0))
    assert mean.shape == stderr.shape == (1, 2)
    np.testing.assert_allclose(mean.sum(-1), 5 / 12, rtol=1e-6)  # efficiency, every order
    np.testing.assert_array_less(np.abs(mean - [[13 / 48, 7 / 48]]), 4 * stderr + 1e-7)
