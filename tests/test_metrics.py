"""Metric kernels: closed forms, a brute-force reference, batching and dtypes."""

import functools
import inspect
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, metrics
from beyondpar.metrics import batching, early_stop, fused, operators

WALKS = metrics.WALKS


# ---------------------------------------------------------------- brute force


def walk_by_definition(c: np.ndarray, walk: str) -> np.ndarray:
    """The forward walk P (rows: from key i) built from DESIGN.md's words, token by token,
    independently of `metrics.transition_matrix`."""
    t = len(c)
    tau = t - 1
    p = np.zeros((t, t))
    p[tau, tau] = 1.0  # the sink is absorbing
    for i in range(tau):
        column = c[:, i]
        if walk == "normalized":
            mass = column.sum()
            if mass > 0:
                p[i] = column / mass
            else:
                p[i, tau] = 1.0
            continue
        previous = 0.0
        for j in range(t):
            clipped = min(1.0, float(column[: j + 1].sum()))
            p[i, j] = clipped - previous
            previous = clipped
        p[i, tau] += 1.0 - previous
    return p


def brute_force(c: np.ndarray, k: int, walk: str, eps: float = 0.25):
    """Every metric by explicit matrix powers, one matrix at a time."""
    c = np.asarray(c, np.float64)
    p = walk_by_definition(c, walk)
    q = p[:-1, :-1]
    powers = [np.linalg.matrix_power(c, t)[-1] for t in range(1, k + 1)]
    survival = [np.append(np.linalg.matrix_power(q, t) @ np.ones(len(q)), 0) for t in range(k + 1)]
    hit = sum(s.sum() for s in survival[:k]) / len(c)
    tv = next((t for t, s in enumerate(survival) if s.max() <= eps), k + 1)
    return np.max(powers, axis=0), hit, tv


def causal(seed, shape, t):
    return graphs.random_causal(seed, shape, t, dtype=np.float64)


def bidirectional(seed: int, t: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.random((t, t)) ** 3
    return m / m.sum(-1, keepdims=True)


@pytest.mark.float64
@pytest.mark.parametrize("walk", WALKS)
@pytest.mark.parametrize("kind", ["causal", "bidirectional", "causal on the triangular path"])
def test_kernels_match_matrix_powers(walk, kind, monkeypatch):
    if kind == "causal on the triangular path":
        monkeypatch.setattr(fused, "TRIANGULAR_MIN_TOKENS", 8)
        monkeypatch.setattr(fused, "TRIANGULAR_SHARED_MIN_TOKENS", 8)
    t, k = 12, 30
    mats = (
        causal(3, (3,), t)
        if kind.startswith("causal")
        else np.stack([bidirectional(s, t) for s in range(3)])
    )
    got = metrics.operator_metrics(mats, horizon=k, max_steps=k, walk=walk)
    for i, c in enumerate(mats):
        phi, hit, tv = brute_force(c, k, walk)
        np.testing.assert_allclose(got.node_fidelity[i], phi, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got.hitting_time[i], hit, rtol=1e-12)
        assert int(got.tv_mixing_time[i]) == tv
        np.testing.assert_allclose(metrics.hitting_time(c, k, walk), hit, rtol=1e-12)
        np.testing.assert_allclose(metrics.node_fidelity(c, k), phi, rtol=1e-12, atol=1e-15)


@pytest.mark.float64
@pytest.mark.parametrize("walk", WALKS)
@pytest.mark.parametrize("t", [7, 9, 10, 23])  # row blocks of the clipped cumulative mass:
def test_transition_matrix_follows_the_definition(walk, t):  # exact, padded, uneven
    sunk = causal(5, (), t) + 3 * np.eye(t)[0]  # token 0's column clips at the first rows
    for c in [bidirectional(4, t), causal(4, (), t), sunk / sunk.sum(-1, keepdims=True)]:
        np.testing.assert_allclose(
            metrics.transition_matrix(c, walk), walk_by_definition(c, walk), atol=1e-14
        )


@pytest.mark.float64
@pytest.mark.parametrize("walk", WALKS)
def test_transition_matrix_inside_a_users_jit_follows_the_definition(walk):
    """Traced (as the weight search's surrogate runs it) the walk is built inline, not by
    the program concrete input gets: the same definition; without `walk`, the reference
    walk."""
    c = bidirectional(4, 9)
    traced = jax.jit(lambda x: metrics.transition_matrix(x, walk))(c)
    np.testing.assert_allclose(traced, walk_by_definition(c, walk), atol=1e-14)
    np.testing.assert_allclose(
        metrics.transition_matrix(c), walk_by_definition(c, "reference"), atol=1e-14
    )


def test_normalized_walk_sends_an_unread_token_to_the_sink():
    """A token no query reads has an all-zero column, so the normalised walk has no way on
    from it: its row of P must be the sink's indicator (rows of P stay stochastic), while
    the other rows are their columns of c over the column mass."""
    c = np.array(
        [
            [1.0, 0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0],  # token 1 reads only token 0; nobody reads token 1
            [0.5, 0.0, 0.5, 0.0],
            [0.25, 0.0, 0.25, 0.5],
        ]
    )
    expected = np.array(
        [
            [1 / 2.75, 1 / 2.75, 0.5 / 2.75, 0.25 / 2.75],
            [0.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 2 / 3, 1 / 3],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )
    p = np.asarray(metrics.transition_matrix(np.stack([c, c]), "normalized"))
    assert p.shape == (2, 4, 4)
    np.testing.assert_allclose(p, np.stack([expected, expected]), atol=1e-12)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)


@pytest.mark.float64
def test_sink_signal_is_last_row_of_powers():
    c = causal(1, (), 6)  # the closed forms' shape: its program serves them
    got = metrics.sink_signal(c, 5)
    assert got.shape == (5, 6)
    for t in range(5):
        np.testing.assert_allclose(got[t], np.linalg.matrix_power(c, t + 1)[-1], rtol=1e-12)
    np.testing.assert_allclose(np.sum(got, -1), 1.0, rtol=1e-12)  # shares sum to one


# ---------------------------------------------------------------- closed forms


def keep_or_pass_cycle(n: int, p: float) -> np.ndarray:
    """Walk from every token i < tau: stay with probability p, else move to i + 1.

    Rows: C[k, k] = p, C[k, k-1] = 1 - p, and row 0 reads the sink with 1 - p, so every
    column before the sink sums to 1 and both walks coincide.
    """
    c = np.zeros((n, n))
    for k in range(n):
        c[k, k] = p
        c[k, (k - 1) % n] = 1 - p
    return c


def binomial_cdf_below(m: int, t: int, q: float) -> float:
    """Pr(Bin(t, q) < m)."""
    return sum(math.comb(t, j) * q**j * (1 - q) ** (t - j) for j in range(min(m, t + 1)))


@pytest.mark.float64
@pytest.mark.parametrize("walk", WALKS)
def test_keep_or_pass_closed_form(walk):
    n, p, k, eps = 6, 0.6, 40, 0.25
    c = keep_or_pass_cycle(n, p)
    tau = n - 1
    survival = [[binomial_cdf_below(tau - i, t, 1 - p) for i in range(tau)] for t in range(k + 1)]
    hit = sum(sum(s) for s in survival[:k]) / n
    tv = next(t for t, s in enumerate(survival) if max(s) <= eps)
    got = np.asarray(metrics.survival(c, k, walk))
    np.testing.assert_allclose(got[:, :tau], survival, rtol=1e-10, atol=1e-15)
    np.testing.assert_array_equal(got[:, tau], 0.0)
    np.testing.assert_allclose(metrics.hitting_time(c, k, walk), hit, rtol=1e-12)
    assert int(metrics.tv_mixing_time(c, eps, k, walk)) == tv
    np.testing.assert_allclose(metrics.spectral_radius(c, walk), p, rtol=1e-12)
    np.testing.assert_allclose(metrics.relaxation_time(c, walk), 1 / (1 - p), rtol=1e-12)
    np.testing.assert_allclose(
        metrics.spectral_mixing_time(c, eps, k, walk), math.log(1 / eps) / math.log(1 / p)
    )
    # Without truncation the walk from i needs tau - i passes of mean 1 / (1 - p) steps.
    long = metrics.hitting_time(c, 2000, walk)
    np.testing.assert_allclose(long, tau * (tau + 1) / 2 / (1 - p) / n, rtol=1e-10)


def star(n: int) -> np.ndarray:
    """Every token keeps itself; the sink reads all tokens uniformly."""
    c = np.eye(n)
    c[-1] = 1.0 / n
    return c


@pytest.mark.float64
def test_star_closed_form():
    n, k, eps = 6, 40, 0.25  # the keep-or-pass cycle's: the walks' programs serve both
    c = star(n)
    phi = np.asarray(metrics.node_fidelity(c, k))
    np.testing.assert_allclose(phi[:-1], (1 - n**-k) / (n - 1), rtol=1e-12)
    np.testing.assert_allclose(phi[-1], 1 / n, rtol=1e-12)
    np.testing.assert_allclose(metrics.minimax_fidelity(c, k), 1 / n, rtol=1e-12)
    q = n / (n + 1)  # normalised walk: a token's column holds 1 (itself) and 1/n (sink)
    hit = (n - 1) / n * (1 - q**k) / (1 - q)
    np.testing.assert_allclose(metrics.hitting_time(c, k, "normalized"), hit, rtol=1e-12)
    assert int(metrics.tv_mixing_time(c, eps, k, "normalized")) == math.ceil(
        math.log(eps) / math.log(q)
    )
    np.testing.assert_allclose(metrics.spectral_radius(c, "normalized"), q, rtol=1e-12)
    # The reference walk clips column mass at 1: a token that attends to itself fully
    # never leaves, so every start but the sink counts the full step cap.
    np.testing.assert_allclose(metrics.hitting_time(c, k, "reference"), k * (n - 1) / n)
    assert int(metrics.tv_mixing_time(c, eps, k, "reference")) == k + 1
    np.testing.assert_allclose(metrics.spectral_radius(c, "reference"), 1.0)
    np.testing.assert_allclose(metrics.spectral_mixing_time(c, eps, k, "reference"), k)


@pytest.mark.float64
def test_uniform_causal_closed_form():
    """Every query attends uniformly to itself and all earlier tokens. Six tokens and
    horizon 40, as the star (also causal): its programs serve."""
    t = 6
    c = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    harmonic = np.concatenate([[0.0], np.cumsum(1 / np.arange(1, t + 1))])  # H_0..H_T
    # The sink reads everyone equally, then only its own 1/T share stays with it.
    np.testing.assert_allclose(metrics.minimax_fidelity(c, 40), 1 / t, rtol=1e-12)
    s2 = (harmonic[t] - harmonic[np.arange(t)]) / t  # step 2 of the sink signal test's 5
    np.testing.assert_allclose(metrics.sink_signal(c, 5)[1], s2, rtol=1e-12)
    # Normalised walk: column i holds 1/(j+1) for j >= i and sums to H_T - H_i.
    i = np.arange(t - 1)
    stay = (1 / (i + 1)) / (harmonic[t] - harmonic[i])
    np.testing.assert_allclose(metrics.spectral_radius(c, "normalized"), stay.max(), rtol=1e-12)
    np.testing.assert_allclose(metrics.spectral_radius(c, "reference"), 1.0)  # token 0 stays


def test_causal_first_token_never_leaves_reference_walk():
    """Causal attention has A[0, 0] = 1, so the paper's sampler keeps token 0 for ever."""
    c = causal(5, (), 10)
    p = np.asarray(metrics.transition_matrix(c, "reference"))
    assert p[0, 0] == 1.0
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.tril(p, -1) == 0)  # a causal walk only moves to later queries


@pytest.mark.float64
def test_deterministic_path_has_zero_spectral_radius():
    n, k = 6, 40  # the keep-or-pass cycle's shape, precision and step cap: its programs
    c = keep_or_pass_cycle(n, 0.0)  # every token passes on in exactly one step
    for walk in WALKS:
        np.testing.assert_allclose(metrics.spectral_radius(c, walk), 0.0)
        np.testing.assert_allclose(metrics.spectral_mixing_time(c, walk=walk), 0.0)
        np.testing.assert_allclose(metrics.relaxation_time(c, walk), 1.0)
        np.testing.assert_allclose(metrics.hitting_time(c, k, walk), (n - 1) / 2)
        assert int(metrics.tv_mixing_time(c, 0.25, k, walk)) == n - 1


@pytest.mark.parametrize("walk", WALKS)
def test_tv_threshold_includes_eps(walk):
    """Survival from token 0 is 1/2^t: exactly eps = 1/4 at t = 2, which counts as mixed."""
    c = np.full((2, 2), 0.5)
    assert int(metrics.tv_mixing_time(c, 0.25, 10, walk)) == 2
    assert int(metrics.operator_metrics(c, 5, 10, 0.25, walk).tv_mixing_time) == 2


@pytest.mark.parametrize("walk,rho", [("reference", 0.42426407), ("normalized", 0.67082039)])
def test_spectral_radius_of_periodic_non_triangular_walk(walk, rho):
    """Q has a two-cycle (0 <-> 1) with eigenvalues +-rho: power iteration without a shift
    oscillates. Q = [[0, .2], [.9, 0]] (reference) and [[0, .5], [.9, 0]] (normalised):
    rho = sqrt(.2 * .9) and sqrt(.5 * .9)."""
    c = np.array([[0, 0.9, 0.1], [0.2, 0, 0.8], [0.2, 0.1, 0.7]])
    q = walk_by_definition(c, walk)[:-1, :-1]
    np.testing.assert_allclose(max(abs(np.linalg.eigvals(q))), rho, rtol=1e-7)
    np.testing.assert_allclose(metrics.spectral_radius(c, walk), rho, rtol=1e-7)
    np.testing.assert_allclose(metrics.operator_metrics(c, walk=walk).spectral_radius, rho, 1e-7)


def test_transition_rows_sum_to_one():
    for walk in WALKS:
        for c in [bidirectional(0, 8), graphs.random_causal(0, (), 8)]:
            p = np.asarray(metrics.transition_matrix(c, walk), np.float64)
            np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
            assert p.min() >= 0
            np.testing.assert_array_equal(p[-1], np.eye(8)[-1])  # absorbing sink


@pytest.mark.float64
def test_power_iteration_matches_eigvals():
    for seed in range(5):  # the keep-or-pass cycle's shape: its spectral programs serve
        c = bidirectional(seed, 6)
        for walk in WALKS:
            q = np.asarray(metrics.transition_matrix(c, walk))[:-1, :-1]
            rho = max(abs(np.linalg.eigvals(q)))
            np.testing.assert_allclose(metrics.spectral_radius(c, walk), rho, rtol=1e-8)


@pytest.mark.float64
def test_spectral_radius_is_max_diagonal_for_causal():
    c = causal(2, (4,), 20)
    for walk in WALKS:
        p = np.asarray(metrics.transition_matrix(c, walk))
        expected = np.max(np.diagonal(p[:, :-1, :-1], axis1=-2, axis2=-1), axis=-1)
        np.testing.assert_array_equal(metrics.spectral_radius(c, walk), expected)


# ---------------------------------------------------------------- the triangular path


@pytest.fixture
def short_triangular(monkeypatch):
    """The triangular path for short operators too (by default only long ones take it)."""
    monkeypatch.setattr(fused, "TRIANGULAR_MIN_TOKENS", 8)
    monkeypatch.setattr(fused, "TRIANGULAR_SHARED_MIN_TOKENS", 8)


@pytest.mark.float64
@pytest.mark.parametrize("t", [13, 40])  # tiles of 4 (the last padded) and of 10 (exact)
def test_triangular_path_equals_the_dense_path(t, monkeypatch, short_triangular):
    """Causal operators skip the zeros above the diagonal (column tiles, GEMMs over all
    steps); every number must be the dense recursion's. Horizon and step cap differ so
    that a mix-up of the two shows."""
    c = causal(t, (3,), t)
    assert metrics.triangular_tile(c) == -(-t // fused.TRIANGULAR_TILES)
    tri, tri_signal = metrics.metrics_by_walk(c, 25, 30, 0.25, WALKS, signal=True)
    monkeypatch.setattr(fused, "TRIANGULAR_MIN_TOKENS", 10**9)
    monkeypatch.setattr(fused, "TRIANGULAR_SHARED_MIN_TOKENS", 10**9)
    assert metrics.triangular_tile(c) is None
    dense, dense_signal = metrics.metrics_by_walk(c, 25, 30, 0.25, WALKS, signal=True)
    np.testing.assert_allclose(tri_signal, dense_signal, rtol=1e-12, atol=1e-15)
    for walk in WALKS:
        for name in metrics.OperatorMetrics._fields:
            np.testing.assert_allclose(
                getattr(tri[walk], name), getattr(dense[walk], name), rtol=1e-12, atol=1e-15
            )


def chain(t: int, keep: float) -> np.ndarray:
    """Causal: every token keeps `keep` of itself and reads the token before it for the
    rest; token 0 reads only itself. The sink's signal drifts down the chain, so the
    lowest peak (token 1's) comes late."""
    c = np.eye(t) * keep + np.eye(t, k=-1) * (1 - keep)
    c[0, 0] = 1.0
    return c


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.float64)])
def test_minimax_fidelity_stops_early_with_the_value_of_every_step(dtype):
    """Causal operators stop the recursion once the minimum is settled; the value must be
    that of all `horizon` steps, bit for bit: sparse and dense mixes of causal heads (they
    settle within a few steps), rows that sum to a little over 1 (within the checked
    tolerance), a token that keeps filling from itself, and a chain whose minimum peaks
    late (cut by the horizon or not)."""
    heads = causal(7, (6, 4), 30).astype(dtype)
    rng = np.random.default_rng(0)
    mixes = [rng.dirichlet(np.full(4, a), 6) for a in (0.2, 1.0, 5.0)]
    cases = [np.einsum("nh,nhij->nij", w, heads).astype(dtype) for w in mixes]
    cases.append((cases[0] * (1 + 9e-5)).astype(dtype))
    # Tokens 1 and 2 hold almost all they get: the minimum (token 2's) still grows after
    # nothing is left above it, from what token 2 itself holds.
    filling = [[1, 0, 0, 0], [0.02, 0.98, 0, 0], [0.01, 0.01, 0.98, 0], [0.19, 0.1, 0.1, 0.61]]
    cases.append(np.asarray(filling, dtype))
    # Token 0's running maximum is the lowest from step 2, when it holds less than it did,
    # but tokens 1 and 3 still hold shares that reach it later (0.125 -> 0.2734375 by step
    # 8): settled by the share at or after it, never by its own share alone.
    late = [[1, 0, 0, 0, 0], [0.9375, 0.0625, 0, 0, 0], [0, 1, 0, 0, 0]]
    late += [[0.125, 0, 0.875, 0, 0], [0, 0.125, 0, 0.3125, 0.5625]]
    cases.append(np.asarray(late, dtype))
    # Of the mixes' shape, so that their programs serve the chains: token 1's fidelity
    # peaks at steps 39, 55, 69 and 93 (within 100 steps), 139 and 279 (cut).
    chains = np.stack([chain(30, keep) for keep in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)])
    cases += [chains.astype(dtype)] * 2
    for c, k in zip(cases, (100, 100, 7, 100, 100, 8, 7, 100), strict=True):
        every_step = np.min(np.asarray(metrics.node_fidelity(c, k)), axis=-1)
        np.testing.assert_array_equal(metrics.minimax_fidelity(c, k), every_step)
        # As a search passes its mixes, a JAX array: the program of the checked call.
        got = metrics.objective_unchecked(jnp.asarray(c), "fidelity", k, 1, "reference")
        np.testing.assert_array_equal(got, every_step)
    full = np.asarray(metrics.node_fidelity(cases[-1], 100))
    assert np.argmin(full[0]) == 1
    # The chain's own peak (NumPy's powers, a property of the case): token 1's comes late.
    signal = [np.linalg.matrix_power(cases[-1][0], t)[-1, 1] for t in range(1, 101)]
    assert np.argmax(signal) > 5


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.float64)])
@pytest.mark.parametrize("walk", WALKS)
def test_hitting_time_stops_early_with_the_value_of_every_step(dtype, walk):
    """The hitting time stops summing once the survival mass left would round away; the
    value must be that of every step of the same loop, bit for bit, and the full sweep's
    (which also gives the other metrics, in its own order of sums) to rounding: mixes of
    causal heads (their walks reach the sink within a few steps), rows that sum to a
    little over 1, operators that read later tokens, and a slow chain whose walks are
    still under way at the last step; at 1 step and 100 (the slow chain's check adds 60)."""
    heads = causal(7, (6, 4), 30).astype(dtype)
    rng = np.random.default_rng(1)
    cases = [np.einsum("nh,nhij->nij", rng.dirichlet(np.full(4, 0.5), 6), heads)]
    cases.append(cases[0] * (1 + 9e-5))
    # All of the mixes' shape (6 x 30 x 30), so that the programs of one serve the others.
    cases.append(np.stack([bidirectional(s, 30) for s in range(6)]))
    cases.append(np.stack([chain(30, keep) for keep in (0.95, 0.5, 0.6, 0.7, 0.8, 0.9)]))
    # The dense sweep's hitting time is the same recursion whether or not it is told that
    # `c` is causal (that only picks how it finds the spectral radius): one program each.
    sweep = functools.partial(metrics.metrics_by_walk, walks=(walk,), validate=False)
    k = 100
    for c in cases:
        c = np.asarray(c, dtype)
        early = metrics.hitting_time(c, k, walk, validate=False)
        every_step = early_stop._settled_hitting_jit(c, max_steps=k, walk=walk, settle=False)
        np.testing.assert_array_equal(early, every_step)
        full = sweep(c, 5, k, causal=False)[0][walk].hitting_time
        np.testing.assert_allclose(early, full, rtol=4 * np.finfo(dtype).eps)
    got = metrics.objective_unchecked(cases[0].astype(dtype), "hitting_time", 5, 1, walk)
    np.testing.assert_allclose(got, np.full(6, 29 / 30), rtol=1e-6)  # S_0 only: (T - 1) / T
    # The slow chain's walks are not done by the last step: every step counts.
    chains = np.asarray(cases[3], dtype)  # the first: keep 0.95
    slow = [float(metrics.hitting_time(chains, k, walk)[0]) for k in (60, 100)]
    assert slow[1] > slow[0] + 20


def test_hitting_time_runs_on_while_a_step_would_still_round_the_sum():
    """Slow chains on the normalised walk, still under way when their survival mass is
    near a unit in the last place of the sum: the loop must not stop while a later step
    could still change the rounded sum, and gives the full sweep's value, bit for bit."""
    for keep in (0.5, 0.7, 0.9):
        c = chain(12, keep).astype(np.float32)
        full = metrics.operator_metrics(c, 5, 300, walk="normalized", validate=False)
        got = metrics.hitting_time(c, 300, "normalized", validate=False)
        np.testing.assert_array_equal(got, full.hitting_time)


@pytest.mark.float64
def test_minimax_fidelity_of_a_non_causal_operator_runs_every_step():
    """The early stop holds for causal operators only. Here tokens read later tokens: the
    sink's share leaves it (down to 0.085 and 0.041) and comes back round the cycle
    0 <- 1 <- 2 -> sink at step 4 (0.362975), after a causal bound would have settled on
    the sink's first share (0.1)."""
    c = np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0.5, 0, 0, 0.5], [0.7, 0.05, 0.15, 0.1]])
    assert not metrics.is_causal(c)
    want = brute_force(c, 20, "reference")[0].min()
    np.testing.assert_allclose(want, 0.362975, rtol=1e-12)
    np.testing.assert_allclose(metrics.minimax_fidelity(c, 20), want, rtol=1e-12)
    for hint in ({}, {"causal": False}):  # a JAX array, as checked: one program
        got = metrics.objective_unchecked(jnp.asarray(c), "fidelity", 20, 1, "reference", **hint)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_blocks_divide_each_devices_share_when_they_can():
    """Padding a batch copies it whole: a block that divides the share is taken instead,
    if one of over half the size exists."""
    assert batching._dividing_block(10, 1536) == 8
    assert batching._dividing_block(10, 1540) == 10
    assert batching._dividing_block(10, 23) == 10  # none in 6..10: pad
    assert batching._dividing_block(7, 7) == 7
    assert batching._dividing_block(1, 5) == 1


def test_dividing_blocks_give_the_padded_blocks_numbers(monkeypatch):
    # 56 operators: 14 per device on four devices (28 per thread on one device of two
    # cores), cut into dividing blocks of 7 where padded blocks would be 10.
    c = causal(3, (56,), 12).astype(np.float32)
    per_device = -(-56 // len(jax.local_devices()))
    assert batching._dividing_block(10, per_device) == 7

    def every_number():
        by_walk, signal = metrics.metrics_by_walk(c, 20, 25, 0.25, WALKS, signal=True)
        return [*jax.tree.leaves(by_walk), signal, metrics.minimax_fidelity(c, 20)]

    divided = every_number()
    monkeypatch.setattr(batching, "_dividing_block", lambda block, per_device: block)
    # New jits of the kernels, traced again with padded blocks (a new function: JAX keeps
    # traces by function); the real kernels keep their programs for the other tests.
    sweep_statics = tuple(inspect.signature(fused._sweep_block).parameters)[1:]
    for module, name, statics in (
        (fused, "_sweep_jit", sweep_statics),
        (early_stop, "_settled_minimax_jit", ("horizon",)),
    ):
        kernel = getattr(module, name).__wrapped__
        fresh = jax.jit(
            lambda c, kernel=kernel, **settings: kernel(c, **settings), static_argnames=statics
        )
        monkeypatch.setattr(module, name, fresh)
    for fast, padded in zip(divided, every_number(), strict=True):
        np.testing.assert_array_equal(fast, padded)


def test_triangular_path_only_for_causal_operators(short_triangular):
    c = causal(1, (2,), 12)
    assert metrics.is_causal(c) and not metrics.is_causal(bidirectional(0, 12))
    assert metrics.triangular_tile(c) == 3
    assert metrics.triangular_tile(np.swapaxes(c, -1, -2)) is None  # upper triangular
    assert metrics.triangular_tile(bidirectional(0, 12)) is None
    assert metrics.triangular_tile(causal(1, (2,), fused.TRIANGULAR_MIN_TOKENS - 1)) is None
    assert jax.jit(lambda x: metrics.triangular_tile(x) is None)(c)  # traced: dense


def record_tiles_and_run(monkeypatch) -> list:
    """The tile (None: the dense path) of every sweep asked for, in order, each run by the
    real kernel: its compiled programs are kept (no fresh trace needed to see the path)."""
    tiles = []
    real = fused._sweep_jit

    def recorded(c, **settings):
        tiles.append(settings["tile"])
        return real(c, **settings)

    monkeypatch.setattr(fused, "_sweep_jit", recorded)
    return tiles


def record_tiles(monkeypatch) -> list:
    """The tile (None: the dense path) of every sweep asked for, in order. The sweep is
    traced but not compiled or run (its numbers are zeros of its shapes): these tests are
    about the path chosen, whose numbers the tests above compare."""
    tiles = []
    real = fused._sweep_jit

    def traced_only(c, **settings):
        tiles.append(settings["tile"])
        shapes = jax.eval_shape(functools.partial(real, **settings), c)
        return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

    monkeypatch.setattr(fused, "_sweep_jit", traced_only)
    return tiles


def test_the_sweep_goes_triangular_later_when_its_recursions_share_c(monkeypatch):
    """On CPU the dense path streams c once a step for every recursion on it, so a sweep
    of only the sink signal and the normalised walk stays dense longer; one with a
    matrix of its own (the reference walk) or a single recursion does not."""
    monkeypatch.setattr(fused, "TRIANGULAR_MIN_TOKENS", 9)
    monkeypatch.setattr(fused, "TRIANGULAR_SHARED_MIN_TOKENS", 17)
    assert fused._triangular_min_tokens(5, ("normalized",)) == 17
    for horizon, walks in [(5, ("reference",)), (5, ("reference", "normalized")), (5, ())]:
        assert fused._triangular_min_tokens(horizon, walks) == 9
    assert fused._triangular_min_tokens(0, ("normalized",)) == 9
    c = causal(2, (2,), 12)
    compiled = record_tiles(monkeypatch)
    for walk in WALKS:
        metrics.operator_metrics(c, horizon=6, max_steps=7, walk=walk)
    metrics.hitting_time(c, 7, walk="normalized")
    assert compiled == [3, None, 3]  # reference: tiles of 3; normalised: dense; one walk


def test_the_papers_length_takes_the_triangular_path_unless_its_recursions_share_c(monkeypatch):
    """At the paper's T = 100 (measured on CPU: 1.2x for fidelity with the reference walk,
    1.3x for a hitting time) causal attention skips its zeros; with only the sink signal
    and the normalised walk on c the dense path stays (0.9x triangular), up to T = 128."""
    compiled = record_tiles(monkeypatch)
    for t in (63, 64, 100, 128):
        c = causal(t, (1,), t)
        for walk in WALKS:
            metrics.operator_metrics(c, horizon=2, max_steps=2, walk=walk, validate=False)
    assert compiled == [None, None, 16, None, 25, None, 32, 32]
    assert metrics.triangular_tile(causal(1, (1,), 100)) == 25


@pytest.mark.float64
def test_metrics_by_walk_is_each_walks_metrics_from_one_pass():
    c = causal(4, (2, 3), 11)
    by_walk, signal = metrics.metrics_by_walk(c, 20, 15, 0.3, signal=True)
    for walk in WALKS:
        one = metrics.operator_metrics(c, 20, 15, 0.3, walk)
        for name in one._fields:
            np.testing.assert_allclose(getattr(by_walk[walk], name), getattr(one, name))
    assert signal.shape == (2, 3, 20, 11)
    for t in (0, 7, 19):
        np.testing.assert_allclose(
            signal[1, 2, t], np.linalg.matrix_power(c[1, 2], t + 1)[-1], rtol=1e-12
        )
    # Every step of every operator, as NumPy's matrix powers give it.
    powers = [np.linalg.matrix_power(c, t)[..., -1, :] for t in range(1, 21)]
    np.testing.assert_allclose(signal, np.stack(powers, axis=-2), rtol=1e-12)
    # Without `signal`, none: the one-walk sweep of `operator_metrics` above.
    assert metrics.metrics_by_walk(c, 20, 15, 0.3, ("reference",))[1] is None
    for walks in [(), ("normalized", "normalized"), ("reference", "forward")]:
        with pytest.raises(ValueError, match="walk"):
            metrics.metrics_by_walk(c, 20, 15, walks=walks)


def test_metrics_by_walk_checks_rows_only_when_asked():
    """`validate` False takes operators as already checked: same numbers on valid rows, and
    rows the check would refuse go through unchecked."""
    c = causal(6, (2,), 7)
    checked, _ = metrics.metrics_by_walk(c, 10, 10)
    unchecked, _ = metrics.metrics_by_walk(c, 10, 10, validate=False)
    jax.tree.map(np.testing.assert_array_equal, unchecked, checked)
    with pytest.raises(ValueError, match="rows must sum to 1"):
        metrics.metrics_by_walk(2 * c, 10, 10)
    metrics.metrics_by_walk(2 * c, 10, 10, validate=False)  # unchecked: no error


# ---------------------------------------------------------------- batching and dtypes


def test_batches_equal_loop():
    # The shape and settings of `test_metrics_by_walk_is_each_walks_metrics_from_one_pass`.
    mats = causal(7, (2, 3), 11)
    batched = metrics.operator_metrics(mats, 20, 15, 0.3)
    for i in range(2):
        for j in range(3):
            one = metrics.operator_metrics(mats[i, j], 20, 15, 0.3)
            for name in one._fields:
                np.testing.assert_allclose(getattr(batched, name)[i, j], getattr(one, name))
    assert batched.node_fidelity.shape == (2, 3, 11)
    assert batched.hitting_time.shape == (2, 3)


@pytest.mark.float64
@pytest.mark.parametrize("n", [1, 3, 5, 23])  # over four devices: pads of 3, 1, 3 and 1
def test_odd_batch_sizes_pad_and_shard(n):
    mats = causal(n, (n,), 8)
    got = metrics.minimax_fidelity(mats, 10)
    expected = [brute_force(c, 10, "reference")[0].min() for c in mats]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize(
    "module, block, kernel",
    [
        (fused, "_sweep_block", metrics.node_fidelity),
        (early_stop, "_settled_hitting_time", metrics.hitting_time),
    ],
)
def test_second_call_does_not_retrace(module, block, kernel, monkeypatch):
    counted = chex.assert_max_traces(getattr(module, block), n=1)
    monkeypatch.setattr(module, block, counted)
    mats = graphs.random_causal(0, (2, 3), 13)
    kernel(mats, 17)
    kernel(mats + 0, 17)  # same shapes, new values: no new trace
    with pytest.raises(AssertionError, match="traced > 1"):
        kernel(mats, 18)  # a new static horizon must trace again
    chex.clear_trace_counter()


@pytest.mark.parametrize(
    "dtype", [jnp.float32, pytest.param(jnp.float64, marks=pytest.mark.float64)]
)
def test_dtype_in_is_dtype_out(dtype):
    # The shape and settings of `test_batches_equal_loop` (float32) and of
    # `test_metrics_by_walk_is_each_walks_metrics_from_one_pass` (float64): their programs.
    c = jnp.asarray(graphs.random_causal(0, (2, 3), 11), dtype)
    m = metrics.operator_metrics(c, 20, 15, 0.3)
    for name in ("node_fidelity", "minimax_fidelity", "hitting_time", "spectral_radius"):
        assert getattr(m, name).dtype == dtype
    assert metrics.sink_signal(c, 3).dtype == dtype
    assert metrics.spectral_mixing_time(c).dtype == dtype
    assert metrics.monte_carlo_hitting_time(jax.random.PRNGKey(0), c, 4, 5).dtype == dtype


def test_works_inside_user_jit():
    c = causal(0, (3,), 10)
    inside = jax.jit(lambda x: metrics.hitting_time(x, 20))(c)
    np.testing.assert_allclose(inside, metrics.hitting_time(c, 20), rtol=1e-12)


# ---------------------------------------------------------------- Monte Carlo


def monte_carlo_agrees(key, c, walk):
    exact = metrics.hitting_time(c, 100, walk)
    mean, stderr = metrics.monte_carlo_hitting_time(
        key, c, num_walks=500, max_steps=100, walk=walk, return_stderr=True
    )
    assert np.all(stderr > 0)
    z = np.abs(np.asarray(mean) - np.asarray(exact)) / np.asarray(stderr)
    assert np.all(z < 4), z


@pytest.mark.float64
@pytest.mark.parametrize("walk", WALKS)
def test_monte_carlo_counts_every_step_of_a_capped_chain(walk):
    """A deterministic chain of 8 tokens capped at 5 steps: starts need 7..0 steps, capped
    to 5,5,5,4,3,2,1,0, mean 25/8. Every walk is exact, so one step more or less shows."""
    c = keep_or_pass_cycle(8, 0.0)
    mean, stderr = metrics.monte_carlo_hitting_time(
        jax.random.PRNGKey(0), c, num_walks=7, max_steps=5, walk=walk, return_stderr=True
    )
    assert float(mean) == float(metrics.hitting_time(c, 5, walk)) == 25 / 8
    assert float(stderr) == 0.0


@pytest.mark.parametrize("walk", WALKS)
def test_monte_carlo_standard_error_is_unbiased_with_two_walks(walk):
    """Two tokens, each column half and half: from token 0 both walks stay or reach the
    sink with probability 1/2, so capped at 2 steps a walk takes 1 or 2 steps (variance
    1/4) and the sink takes 0. With n = 2 walks the estimate (mean over T = 2 starts) has
    variance 1/4 / n / T^2 = 1/32; the squared standard error must be unbiased for it
    (a variance without Bessel's correction would average 1/64), and the spread of the
    estimates over independent copies must agree."""
    copies = 4000
    c = np.full((copies, 2, 2), 0.5)
    mean, stderr = metrics.monte_carlo_hitting_time(
        jax.random.PRNGKey(3), c, num_walks=2, max_steps=2, walk=walk, return_stderr=True
    )
    mean, stderr = np.asarray(mean, np.float64), np.asarray(stderr, np.float64)
    assert mean.shape == stderr.shape == (copies,)
    assert set(np.unique(stderr**2 * 16).round(12)) <= {0.0, 1.0}  # (x1 - x2)^2 / 2 / n / T^2
    np.testing.assert_allclose(np.mean(mean), 0.75, atol=0.01)  # (1.5 + 0) / 2
    np.testing.assert_allclose(np.mean(stderr**2), 1 / 32, rtol=0.1)
    np.testing.assert_allclose(np.var(mean, ddof=1), 1 / 32, rtol=0.15)


@pytest.mark.parametrize("walk", WALKS)
def test_monte_carlo_on_random_causal(walk):
    c = causal(11, (2,), 100)  # the shape of the fixtures' mixes below: their programs
    monte_carlo_agrees(jax.random.PRNGKey(1), c, walk)


@pytest.mark.parametrize("walk", WALKS)
def test_monte_carlo_on_fixture(fixture, walk):
    _, _, expected = fixture

    c = graphs.combine_heads(expected["attention"][0, 1:3], expected["head_weights"][1:3])
    monte_carlo_agrees(jax.random.PRNGKey(2), np.asarray(c, np.float64), walk)


# ---------------------------------------------------------------- validation


BAD_OPERATORS = [
    (np.ones((3, 4)) / 4, r"c must have shape \(\.\.\., T, T\) with square matrices, got \(3, 4\)"),
    (np.ones(3), r"square matrices, got \(3,\)"),
    (np.ones((1, 1)), "at least T=2 tokens, got T=1"),
    (np.array([[1.5, -0.5], [0.0, 1.0]]), "non-negative, got minimum entry -0.5"),
    (
        np.array([[0.5, 0.4], [0.0, 1.0]]),
        "rows must sum to 1 .tolerance 0.0001., got a row off by 0.1",
    ),
    (np.array([[np.nan, 1.0], [0.0, 1.0]]), "finite, got NaN or Inf"),
    (np.array([[np.inf, 1.0], [0.0, 1.0]]), "finite, got NaN or Inf"),
]


@pytest.mark.parametrize("bad,message", BAD_OPERATORS)
@pytest.mark.parametrize(
    "fn",
    [
        metrics.minimax_fidelity,
        metrics.node_fidelity,
        metrics.hitting_time,
        metrics.tv_mixing_time,
        metrics.spectral_mixing_time,
        lambda c: metrics.sink_signal(c, 3),
        lambda c: metrics.survival(c, 3),
        lambda c: metrics.monte_carlo_hitting_time(jax.random.PRNGKey(0), c),
    ],
)
def test_bad_operators(fn, bad, message):
    with pytest.raises(ValueError, match=message):
        fn(bad)


def test_float32_attention_cast_to_float64_passes_row_check():
    c = graphs.random_causal(0, (2,), 100)  # float32 rows: sum off by ~1e-7
    assert metrics.hitting_time(c.astype(np.float64)).shape == (2,)  # the Monte Carlo shape


@pytest.mark.float64
@pytest.mark.parametrize("half", [jnp.float16, jnp.bfloat16])
def test_half_precision_attention_is_checked_to_its_rounding_and_run_in_float32(half):
    """Attention saved in half precision: rows off by its rounding pass, the metrics run
    in float32 on the stored values, and a row off by more is still refused."""
    c = graphs.random_causal(3, (2,), 64)
    stored = jnp.asarray(c, half)
    assert float(jnp.max(jnp.abs(jnp.sum(stored.astype(jnp.float64), -1) - 1))) > 1e-4
    got = metrics.minimax_fidelity(stored)
    assert got.dtype == jnp.float32
    widened = stored.astype(jnp.float32)  # the same values, unchecked
    want = metrics.objective_unchecked(widened, "fidelity", 100, 100, "reference")
    np.testing.assert_allclose(got, want, rtol=1e-6)
    eps = float(jnp.finfo(half).eps)
    off = jnp.asarray(np.array([[0.5, 0.4], [0.0, 1.0]]), half)
    with pytest.raises(ValueError, match=f"tolerance {eps:.3g}.*off by 0.(1|0996)"):
        metrics.minimax_fidelity(off)


def test_a_negative_entry_smaller_than_the_row_tolerance_is_still_refused():
    """Entries must be non-negative exactly: the row-sum tolerance does not excuse them."""
    c = np.array([[1.0 + 1e-6, -1e-6], [0.0, 1.0]])
    with pytest.raises(ValueError, match="c must be non-negative, got minimum entry -1e-06"):
        metrics.check_operator(c)
    half = jnp.asarray(np.array([[1.0, -1e-4], [0.0, 1.0]]), jnp.float16)
    with pytest.raises(ValueError, match="c must be non-negative, got minimum entry -0.0001"):
        metrics.check_operator(half)


GOOD = star(4)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: metrics.minimax_fidelity(GOOD, horizon=0),
            "horizon must be an integer >= 1, got 0",
        ),
        (
            lambda: metrics.node_fidelity(GOOD, horizon=2.5),
            "horizon must be an integer >= 1, got 2.5",
        ),
        (
            lambda: metrics.hitting_time(GOOD, max_steps=0),
            "max_steps must be an integer >= 1, got 0",
        ),
        (lambda: metrics.hitting_time(GOOD, walk="lazy"), "walk must be one of .*, got 'lazy'"),
        (
            lambda: metrics.tv_mixing_time(GOOD, eps=1.0),
            r"eps must be in the open interval \(0, 1\), got 1.0",
        ),
        (
            lambda: metrics.tv_mixing_time(GOOD, eps=0),
            r"eps must be in the open interval \(0, 1\), got 0",
        ),
        (lambda: metrics.spectral_mixing_time(GOOD, eps=-0.1), "eps must be in the open"),
        (lambda: metrics.spectral_radius(GOOD, walk="x"), "walk must be one of"),
        (lambda: metrics.sink_signal(GOOD, 0), "steps must be an integer >= 1, got 0"),
        (
            lambda: metrics.monte_carlo_hitting_time(jax.random.PRNGKey(0), GOOD, num_walks=0),
            "num_walks must be an integer >= 1, got 0",
        ),
        (lambda: metrics.operator_metrics(np.zeros((0, 3, 3))), "at least one matrix"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------- the paper's released checkpoints


REFERENCE_TOLERANCE = {jnp.float64: 1e-6, jnp.float32: 1e-4}


def layer_kernels(state, layers=4):
    """Flax Dense kernels (in x out) of each layer's attention output projection."""
    return [state[f"layers.{i}.attn.out_proj.weight"].T for i in range(layers)]


def test_head_importance_equals_head_weights(fixture):
    _, state, expected = fixture
    num_heads = expected["attention"].shape[2]
    got = np.stack([graphs.head_importance(k, num_heads) for k in layer_kernels(state)])
    np.testing.assert_allclose(got, expected["head_weights"], rtol=1e-6)


@pytest.mark.parametrize(
    "dtype", [pytest.param(jnp.float64, marks=pytest.mark.float64), jnp.float32]
)
def test_fidelity_equals_reference(fixture, dtype):
    _, _, expected = fixture
    attn = jnp.asarray(expected["attention"], dtype)
    rtol = REFERENCE_TOLERANCE[dtype]
    learned = graphs.combine_heads(attn, expected["head_weights"])
    np.testing.assert_allclose(
        metrics.minimax_fidelity(learned), expected["fidelity_learned"] / 100, rtol=rtol
    )
    uniform = graphs.combine_heads(attn)
    np.testing.assert_allclose(
        metrics.minimax_fidelity(uniform), expected["fidelity_uniform"] / 100, rtol=rtol
    )
    np.testing.assert_allclose(
        metrics.minimax_fidelity(attn), expected["fidelity_per_head"] / 100, rtol=rtol
    )


@pytest.mark.parametrize(
    "dtype", [pytest.param(jnp.float64, marks=pytest.mark.float64), jnp.float32]
)
@pytest.mark.parametrize("walk", metrics.WALKS)
def test_hitting_time_equals_reference(fixture, dtype, walk):
    _, _, expected = fixture
    attn = jnp.asarray(expected["attention"], dtype)
    learned = graphs.combine_heads(attn, expected["head_weights"])
    got = metrics.hitting_time(learned, 100, walk)
    assert got.dtype == dtype
    np.testing.assert_allclose(
        got, expected[f"hitting_time_{walk}"], rtol=REFERENCE_TOLERANCE[dtype]
    )


@pytest.mark.float64
def test_fused_metrics_equal_single_kernels(fixture):
    _, _, expected = fixture
    attn = jnp.asarray(expected["attention"], jnp.float64)
    c = graphs.combine_heads(attn, expected["head_weights"])
    one_pass = metrics.operator_metrics(c, walk="normalized")
    np.testing.assert_allclose(
        one_pass.minimax_fidelity, expected["fidelity_learned"] / 100, rtol=1e-6
    )
    np.testing.assert_allclose(
        one_pass.hitting_time, expected["hitting_time_normalized"], rtol=1e-6
    )
    np.testing.assert_array_equal(
        one_pass.tv_mixing_time, metrics.tv_mixing_time(c, walk="normalized")
    )


@pytest.mark.float64
@pytest.mark.parametrize("path", ["dense", "triangular"])
def test_the_sink_signal_and_reference_walk_share_products_and_keep_their_numbers(
    path, monkeypatch
):
    """With the reference walk alone, the sink signal (on c) and the walk (on its own
    matrix) step as one batch; each metric must still be its own kernel's, and the sink
    signal the one `sink_signal` gives: a mix-up of the two halves shows."""
    if path == "triangular":
        monkeypatch.setattr(fused, "TRIANGULAR_MIN_TOKENS", 8)
    c = causal(11, (2, 3), 13)
    horizon, max_steps, eps = 17, 23, 0.35
    paths = []
    real = fused._triangular_paths
    monkeypatch.setattr(fused, "_triangular_paths", lambda *a: paths.append(1) or real(*a))
    by_walk, signal = metrics.metrics_by_walk(
        c, horizon, max_steps, eps, ("reference",), signal=True
    )
    assert bool(paths) == (path == "triangular")
    one_pass = by_walk["reference"]
    np.testing.assert_allclose(one_pass.node_fidelity, metrics.node_fidelity(c, horizon), rtol=1e-6)
    np.testing.assert_allclose(
        one_pass.hitting_time, metrics.hitting_time(c, max_steps, "reference"), rtol=1e-6
    )
    np.testing.assert_array_equal(
        one_pass.tv_mixing_time, metrics.tv_mixing_time(c, eps, max_steps, "reference")
    )
    powers = [np.linalg.matrix_power(c, t)[..., -1, :] for t in range(1, horizon + 1)]
    np.testing.assert_allclose(signal, np.stack(powers, axis=-2), atol=1e-12)


def test_a_known_causality_skips_the_check_and_picks_the_path(monkeypatch, short_triangular):
    """`causal` from a caller that checked it (mixes of checked causal heads): no second
    pass over the entries, the triangular path for True and the dense one for False, and
    the numbers of the call that checks."""
    c = causal(2, (3,), 12).astype(np.float32)
    run = lambda **hint: jax.tree.leaves(
        metrics.metrics_by_walk(c, 20, 25, 0.3, WALKS, signal=True, **hint)
    )
    scores = lambda **hint: [
        metrics.objective_unchecked(c, objective, 20, 25, "reference", **hint)
        for objective in ("fidelity", "hitting_time")
    ]
    checked, checked_scores = run(), scores()
    for where in (metrics, operators):  # the public name and the one the kernels call
        monkeypatch.setattr(where, "is_causal", lambda c: pytest.fail("causality checked again"))
    tiles = record_tiles_and_run(monkeypatch)
    for hint in (True, False):
        tiles.clear()
        hinted = run(causal=hint) + scores(causal=hint)
        for want, got in zip(checked + checked_scores, hinted, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert tiles and all(tile == (3 if hint else None) for tile in tiles)


def test_an_unknown_causality_is_checked_and_picks_the_path(monkeypatch, short_triangular):
    """Without `causal` the kernels check it themselves: causal operators take the
    triangular path, the others the dense one."""
    tiles = record_tiles_and_run(monkeypatch)
    calls = [
        lambda c: metrics.metrics_by_walk(c, 20, 25, 0.3, WALKS, signal=True),
        lambda c: metrics.operator_metrics(c, 20, 25, 0.3, "normalized"),
        lambda c: metrics.objective_unchecked(c, "hitting_time", 20, 25, "reference"),
    ]
    bidirectional_3xTxT = np.stack([bidirectional(s, 12) for s in range(2, 5)])
    for c, triangular in ((causal(2, (3,), 12), True), (bidirectional_3xTxT, False)):
        for call in calls:
            tiles.clear()
            call(c)
            # The sweep's tile, or no sweep (the early-stopping hitting time): dense.
            assert any(tiles) == triangular
            assert all(tile == 3 for tile in tiles) if triangular else not any(tiles)


def test_finite_rows_that_overflow_are_named_by_their_sum_not_as_infinite():
    """The check reads rows: a row of finite entries whose sum overflows float32 is a
    row-sum error, an infinite or NaN entry a non-finite one, in any matrix of the batch."""
    c = causal(7, (3,), 5).astype(np.float32)
    big = c.copy()
    big[2, 4, :2] = 3e38  # finite, but 6e38 overflows float32
    with pytest.raises(ValueError, match="rows must sum to 1 .* off by inf"):
        metrics.check_operator(big)
    for bad in (np.inf, -np.inf, np.nan):
        broken = c.copy()
        broken[1, 3, 0] = bad
        with pytest.raises(ValueError, match="must be finite"):
            metrics.check_operator(broken)


@pytest.mark.float64
@pytest.mark.parametrize("parts", [1, 3])
def test_check_operator_reads_every_part_of_a_batch(parts, monkeypatch):
    """In a plain session (one CPU device) the check runs in one part per thread: a
    fault in the last matrix, in the first, or spread over parts is still found, and
    valid batches pass with their values."""
    monkeypatch.setattr(batching, "_thread_parts", lambda c: parts)
    c = causal(8, (7,), 6)
    np.testing.assert_array_equal(metrics.check_operator(c), c)
    faults = [
        ((-1, 5, 0), np.nan, "c must be finite"),
        ((0, 2, 1), -1e-3, "c must be non-negative, got minimum entry -0.001"),
        ((3, 4, 4), c[3, 4, 4] + 2, r"c rows must sum to 1 .* off by 2"),
    ]
    for where, value, message in faults:
        bad = c.copy()
        bad[where] = value
        with pytest.raises(ValueError, match=message):
            metrics.check_operator(bad)


@pytest.mark.float64
@pytest.mark.parametrize("where", [0, 2, 5])  # a matrix of the first, middle, last part
def test_check_operator_reads_every_part_of_a_threaded_batch(where, monkeypatch):
    """A batch checked in parts, one per thread: one bad matrix in any part fails the whole
    batch (finite, non-negative, rows are each judged over all parts)."""
    monkeypatch.setattr(batching, "_thread_parts", lambda c: 3)  # parts of 2 matrices
    c = causal(7, (6,), 6)
    np.testing.assert_array_equal(metrics.check_operator(c), c)
    defects = {
        "finite, got NaN or Inf": lambda m: m.__setitem__((2, 0), np.nan),
        "non-negative, got minimum entry -0.1": lambda m: m.__setitem__((3, 0), -0.1),
        "rows must sum to 1 .tolerance 0.0001., got a row off by 0.01": lambda m: m.__setitem__(
            4, m[4] * 1.01
        ),
    }
    for message, spoil in defects.items():
        bad = c.copy()
        spoil(bad[where])
        with pytest.raises(ValueError, match=message):
            metrics.check_operator(bad)


def test_an_empty_batch_is_not_causal():
    """Nothing to read, as for a traced batch: `is_causal` says not causal, so an empty
    batch never takes the triangular path, and the check passes it as it is."""
    empty = np.zeros((0, 5, 5))
    assert metrics.is_causal(empty) is False
    assert metrics.check_operator(empty).shape == (0, 5, 5)


def test_a_threaded_batch_compiles_each_kernel_once_and_drops_its_padding(monkeypatch):
    """A plain session's batch goes to threads in parts of one size, the last padded: 8
    operators in 3 parts of 3 compile each kernel once (parts of 3, 3 and 2 compiled two
    programs), and every operator gets the values of the unthreaded call."""
    c = causal(31, (8,), 13)
    kernels = {
        "fidelity": (lambda x: metrics.minimax_fidelity(x, 7), early_stop._settled_minimax_jit),
        "hitting": (lambda x: metrics.hitting_time(x, 6), early_stop._settled_hitting_jit),
        "all": (lambda x: metrics.operator_metrics(x, 5, 4), fused._sweep_jit),
    }
    whole = {name: jax.tree.map(np.asarray, run(c)) for name, (run, _) in kernels.items()}
    monkeypatch.setattr(batching, "_thread_parts", lambda c: 3)
    for name, (run, jitted) in kernels.items():
        before = jitted._cache_size()
        got = jax.tree.map(np.asarray, run(c))
        assert jitted._cache_size() == before + 1, name
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(whole[name]), strict=True):
            assert g.shape == w.shape and g.shape[0] == 8, name
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=0, err_msg=name)
