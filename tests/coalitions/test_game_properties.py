"""The coalition game against its definitions: the transforms against brute-force sums
over subsets (float64), every coalition's value against the metric of its mix measured
alone, and sampled Shapley values against the marginals of the orders they draw."""

import itertools
import math

import jax
import numpy as np
import pytest

from beyondpar import coalitions, metrics
from beyondpar.coalitions import mix_game


def _members(c: int, h: int) -> list[int]:
    return [i for i in range(h) if c >> i & 1]


def _brute_shapley(v, h):
    """phi_i = sum_{S not containing i} |S|! (H - |S| - 1)! / H! (v(S + i) - v(S))."""
    phi = np.zeros(v.shape[:-1] + (h,))
    for i in range(h):
        for s in range(2**h):
            if s >> i & 1:
                continue
            k = len(_members(s, h))
            weight = math.factorial(k) * math.factorial(h - k - 1) / math.factorial(h)
            phi[..., i] += weight * (v[..., s | 1 << i] - v[..., s])
    return phi


def _brute_interaction(v, h):
    """I_ij = sum_{S without i, j} |S|! (H - |S| - 2)! / (H - 1)! (discrete derivative)."""
    out = np.zeros(v.shape[:-1] + (h, h))
    for i, j in itertools.permutations(range(h), 2):
        for s in range(2**h):
            if s >> i & 1 or s >> j & 1:
                continue
            k = len(_members(s, h))
            weight = math.factorial(k) * math.factorial(h - k - 2) / math.factorial(h - 1)
            a, b = 1 << i, 1 << j
            out[..., i, j] += weight * (
                v[..., s | a | b] - v[..., s | a] - v[..., s | b] + v[..., s]
            )
    return out


@pytest.mark.float64
def test_masks_sizes_and_dividends_follow_the_bitmask_definitions():
    h = 4
    masks = coalitions.coalition_masks(h)
    for c in range(2**h):
        assert masks[c].tolist() == [float(c >> i & 1) for i in range(h)]
    np.testing.assert_array_equal(
        coalitions.coalition_sizes(h), [bin(c).count("1") for c in range(16)]
    )
    v = np.random.default_rng(0).normal(size=(2, 2**h))
    d = np.zeros_like(v)
    for s in range(2**h):
        for t in range(2**h):
            if t & ~s == 0:
                d[:, s] += (-1) ** (bin(s).count("1") - bin(t).count("1")) * v[:, t]
    np.testing.assert_allclose(coalitions.harsanyi(v), d, atol=1e-12)
    np.testing.assert_allclose(coalitions.zeta(d), v, atol=1e-12)


@pytest.mark.float64
@pytest.mark.parametrize("h", [2, 3, 5])
def test_shapley_and_interaction_match_the_weighted_sums(h):
    v = np.random.default_rng(h).normal(size=(3, 2**h))
    phi = np.asarray(coalitions.shapley(v))
    np.testing.assert_allclose(phi, _brute_shapley(v, h), atol=1e-12)
    np.testing.assert_allclose(phi.sum(-1), v[:, -1] - v[:, 0], atol=1e-12)
    inter = np.asarray(coalitions.interaction(v))
    expected = _brute_interaction(v, h)
    off = ~np.eye(h, dtype=bool)
    np.testing.assert_allclose(inter[:, off], expected[:, off], atol=1e-12)
    np.testing.assert_allclose(np.diagonal(inter, axis1=-2, axis2=-1), phi, atol=1e-12)


def _attention(seed, b, h, t, lazy=0.0):
    """Causal row-stochastic attention, its diagonal raised by `lazy` (slow walks)."""
    logits = np.random.default_rng(seed).normal(size=(b, h, t, t)) * 2
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    a = (1 - lazy) * a + lazy * np.eye(t)
    return a.astype(np.float32)


def _one_at_a_time(attn, weights, objective, horizon, walk):
    """(B, 2^H): each coalition's mix formed by hand and measured by `beyondpar.metrics`
    (the weightless ones given the empty coalition's value)."""
    b, h, t = attn.shape[:3]
    w = weights[:, None, :] * coalitions.coalition_masks(h)[None]  # B x C x H
    total = w.sum(-1, keepdims=True)
    rows = np.where(total > 0, w / np.where(total > 0, total, 1), 1 / h)
    mix = np.einsum("bch,bhij->bcij", rows, attn.astype(np.float64)).astype(np.float32)
    if objective == "fidelity":
        out = metrics.minimax_fidelity(mix, horizon)
    else:
        out = metrics.hitting_time(mix, horizon, walk)
    return np.where(total[..., 0] > 0, out, coalitions.empty_value(objective, t, horizon))


CASES = [
    ("fidelity", None, "reference", 0.0),
    ("hitting_time", None, "reference", 0.9),
    ("hitting_time", 5, "normalized", 0.0),
]


@pytest.mark.parametrize("objective,horizon,walk,lazy", CASES)
def test_every_coalition_is_its_mix_measured_alone(objective, horizon, walk, lazy):
    attn = _attention(1, 2, 3, 6, lazy)
    weights = np.array([[0.5, 0.0, 1.5], [1.0, 2.0, 1.0]])
    expected = _one_at_a_time(attn, weights, objective, horizon or 100, walk)
    kw = dict(objective=objective, horizon=horizon, walk=walk)
    table = coalitions.values(attn, weights, **kw)
    np.testing.assert_allclose(table, expected, rtol=2e-4, atol=2e-5)
    # In parts of the index (block of 2: one low bit), and batch by batch, in any order.
    game = coalitions.mix_value_fn(attn, weights, block_size=2, **kw)
    np.testing.assert_allclose(coalitions.values(value_fn=game), expected, rtol=2e-4, atol=2e-5)
    order = np.random.default_rng(2).permutation(2**3)
    masks = coalitions.coalition_masks(3)[order]
    np.testing.assert_allclose(game(masks), expected[:, order], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(
        game(masks[order != 0]), expected[:, order[order != 0]], rtol=2e-4, atol=2e-5
    )


def test_empty_coalition_and_weightless_head_take_the_no_propagation_value():
    """On the shape and settings of the first two CASES (their programs)."""
    attn = _attention(3, 2, 3, 6)
    weights = np.array([1.0, 0.0, 2.0])
    for objective, empty in (("fidelity", 0.0), ("hitting_time", 100 * 5 / 6)):
        assert coalitions.empty_value(objective, 6, 100) == pytest.approx(empty)
        table = coalitions.values(attn, weights, objective=objective)
        np.testing.assert_array_equal(table[:, 0], np.float32(empty))
        np.testing.assert_array_equal(table[:, 0b010], np.float32(empty))
        phi = np.asarray(coalitions.shapley(table))
        np.testing.assert_array_equal(phi[:, 1], 0.0)


def _game_with_triple(h):
    """A game with pair terms and one triple: v(S) = sum_{i in S} a_i + sum_{i<j in S} b_ij
    + e [heads 0, 1, 2 in S] (B = 2); the triple keeps antithetic pairs from being exact."""
    rng = np.random.default_rng(h)
    a, b = rng.normal(size=(2, h)), np.triu(rng.normal(size=(2, h, h)), 1)
    e = rng.normal(size=(2, 1)) * 3

    def value_fn(masks_KxH):
        m = np.asarray(masks_KxH, np.float64)
        triple = np.prod(m[:, :3], -1)[None]
        return (m @ a.T).T + np.einsum("ki,bij,kj->bk", m, b, m) + e * triple

    return value_fn


def test_sixteen_heads_is_exact_and_seventeen_is_refused():
    value_fn = _game_with_triple(16)
    table = coalitions.values(value_fn=value_fn, num_heads=16)
    assert table.shape == (2, 2**16)
    phi, err = coalitions.shapley_values(value_fn=value_fn, num_heads=16)
    np.testing.assert_allclose(phi.sum(-1), table[:, -1] - table[:, 0], rtol=1e-5)
    np.testing.assert_array_equal(err, 0.0)
    with pytest.raises(ValueError, match="at most 16"):
        mix_game.check_exact(17)
    with pytest.raises(ValueError, match="samples"):
        coalitions.shapley_values(value_fn=_game_with_triple(17), num_heads=17)


def _expected_sample(value_fn, order, antithetic):
    """(mean, stderr) of the marginals of each order, computed order by order."""
    p, h = order.shape
    marg = np.zeros((2, p, h))
    for k, o in enumerate(order):
        mask = np.zeros(h)
        before = value_fn(mask[None])[:, 0]
        for head in o:
            mask[head] = 1
            after = value_fn(mask[None])[:, 0]
            marg[:, k, head] = after - before
            before = after
    if antithetic:
        marg = (marg[:, : p // 2] + marg[:, p // 2 :]) / 2
    return marg.mean(1), marg.std(1, ddof=1) / np.sqrt(marg.shape[1])


@pytest.mark.float64
@pytest.mark.parametrize("antithetic", [False, True])
def test_sampled_shapley_is_the_mean_and_stderr_of_each_orders_marginals(antithetic):
    """Six orders drawn in both cases (one program draws them), reversed too when
    antithetic."""
    h, key = 5, jax.random.PRNGKey(3)
    p = 12 if antithetic else 6
    value_fn = _game_with_triple(h)
    order = coalitions.orders(key, h, p // 2 if antithetic else p)
    assert len({tuple(o) for o in order}) > 1  # independent orders, not one repeated
    if antithetic:
        order = np.concatenate([order, order[:, ::-1]])
    mean, err = coalitions.sampled_shapley(value_fn, h, p, key, antithetic=antithetic)
    want_mean, want_err = _expected_sample(value_fn, order, antithetic)
    np.testing.assert_allclose(mean, want_mean, atol=1e-10)
    np.testing.assert_allclose(err, want_err, atol=1e-10)
    exact = _brute_shapley(value_fn(coalitions.coalition_masks(h)), h)
    assert np.all(np.abs(mean - exact) <= 6 * err + 1e-9)


def test_shapley_values_samples_with_the_given_key():
    value_fn, key = _game_with_triple(4), jax.random.PRNGKey(7)
    got = coalitions.shapley_values(value_fn=value_fn, num_heads=4, samples=6, key=key)
    want = coalitions.sampled_shapley(value_fn, 4, 6, key)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_slow_fidelity_runs_until_no_later_step_can_raise_the_minimum():
    """A lazy causal head whose least-reached token still gains share from the tokens after
    it when the others have settled: the loop must not stop on those tokens' share alone."""
    c = np.array([[1.0, 0.0, 0.0], [0.0083, 0.9917, 0.0], [0.0231, 0.0094, 0.9675]])
    c = (c / c.sum(-1, keepdims=True)).astype(np.float32)
    table = coalitions.values(c[None, None])
    assert table[0, 1] == pytest.approx(float(metrics.minimax_fidelity(c)), rel=1e-5)
