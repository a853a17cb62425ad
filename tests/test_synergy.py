"""Multi-head analyses: amplification and pairwise synergy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, measure, metrics, pruning, synergy, weighting
from beyondpar.study import worked_example


@pytest.mark.float64
def test_example2_pair_synergy():
    ops = worked_example.operators()
    heads = jnp.stack([ops["head1"], ops["head2"]])
    got = np.asarray(synergy.pairwise_synergy(heads))
    np.testing.assert_allclose(got, [[0, 5 / 12 - 3 / 8], [5 / 12 - 3 / 8, 0]], atol=1e-12)


def test_pairwise_synergy_batches_and_matches_amplification():
    attn = graphs.random_causal(0, (2, 3), 10, dtype=np.float64)  # B x H x T x T
    got = np.asarray(synergy.pairwise_synergy(attn, 30))
    assert got.shape == (2, 3, 3)
    np.testing.assert_allclose(got, np.swapaxes(got, -1, -2))
    for b in range(2):
        pair = 0.5 * (attn[b, 0] + attn[b, 2])
        amp = synergy.amplification(
            metrics.minimax_fidelity(attn[b, [0, 2]], 30), metrics.minimax_fidelity(pair, 30)
        )
        np.testing.assert_allclose(got[b, 0, 2], amp["gain"], rtol=1e-12)
    with pytest.raises(ValueError, match=r"attn must have shape \(\.\.\., H, T, T\)"):
        synergy.pairwise_synergy(np.eye(3))


@pytest.mark.float64
def test_amplification_takes_lists_and_batches_of_heads():
    amp = synergy.amplification([0.375, 0.25], 5 / 12)
    np.testing.assert_allclose(amp["best_individual"], 0.375)
    np.testing.assert_allclose(amp["gain"], 5 / 12 - 0.375)
    batch = synergy.amplification([[0.1, 0.3, 0.2], [0.5, 0.4, 0.6]], [0.35, 0.55])
    np.testing.assert_allclose(batch["best_individual"], [0.3, 0.6])
    np.testing.assert_allclose(batch["combined"], [0.35, 0.55])
    np.testing.assert_allclose(batch["gain"], [0.05, -0.05], atol=1e-12)


def test_amplification_of_a_single_head_has_no_gain_over_itself():
    amp = synergy.amplification([0.4], 0.4)
    np.testing.assert_allclose(amp["best_individual"], 0.4)
    np.testing.assert_allclose(amp["gain"], 0.0)
    batch = synergy.amplification([[0.2], [0.7]], [0.5, 0.6])
    np.testing.assert_allclose(batch["best_individual"], [0.2, 0.7])
    np.testing.assert_allclose(batch["gain"], [0.3, -0.1], atol=1e-6)


@pytest.mark.parametrize(
    "per_head, combined, message",
    [
        ([0.3, 0.2], [0.4, 0.5], r"combined_fidelity must have shape \(\) .* got shape \(2,\)"),
        ([[0.3, 0.2]], 0.4, r"combined_fidelity must have shape \(1,\) .* got shape \(\)"),
        ([], 0.4, r"per_head_fidelity_xH must end in an axis of at least one head, got shape"),
        (0.3, 0.4, r"per_head_fidelity_xH must end in an axis .* got shape \(\)"),
    ],
)
def test_amplification_names_the_argument_of_a_bad_shape(per_head, combined, message):
    with pytest.raises(ValueError, match=message):
        synergy.amplification(per_head, combined)


def example2_heads():
    ops = worked_example.operators()
    return jnp.stack([ops["head1"], ops["head2"]])


@pytest.mark.float64
def test_example2_head_diversity():
    """Rows of the two heads differ by 0 (u), 1/2 (v), 1/3 (w), 1/3 (tau)."""
    np.testing.assert_allclose(synergy.head_diversity(example2_heads()), 7 / 24, rtol=1e-12)
    same = jnp.stack([example2_heads()[0]] * 3)
    np.testing.assert_allclose(synergy.head_diversity(same), 0.0)
    disjoint = np.stack([np.eye(3), np.eye(3)[[0, 0, 1]]])  # rows 1, 2 disjoint
    np.testing.assert_allclose(synergy.head_diversity(disjoint), 2 / 3)
    np.testing.assert_allclose(synergy.head_diversity(example2_heads()[:1]), 0.0)


@pytest.mark.float64
def test_example2_cross_head_share():
    """Token v peaks at t = 3 with 0.44965, of which single-head paths carry 0.13021."""
    share = np.asarray(synergy.cross_head_share(example2_heads(), jnp.array([0.5, 0.5])))
    np.testing.assert_allclose(share[1], 1 - 0.13020833333 / 0.44965277777, rtol=1e-9)
    np.testing.assert_allclose(share[1], 0.71042, atol=1e-5)
    np.testing.assert_array_equal(share[2:], 0.0)  # w and tau peak at t = 1: one edge


@pytest.mark.float64
def test_cross_head_share_is_zero_for_one_head_and_batches():
    attn = graphs.random_causal(3, (2, 3), 8, dtype=np.float64)
    one = synergy.cross_head_share(attn, np.array([0.0, 1.0, 0.0]), 30)
    np.testing.assert_allclose(one, 0.0, atol=1e-12)
    w = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 1.0]])
    got = synergy.cross_head_share(attn, w, 30)
    for b in range(2):
        mixed = np.einsum("h,hij->ij", w[b] / w[b].sum(), attn[b])
        signal = np.stack([np.linalg.matrix_power(mixed, t)[-1] for t in range(1, 31)])
        single = np.stack(
            [
                sum(
                    (w[b, h] / w[b].sum()) ** t * np.linalg.matrix_power(attn[b, h], t)[-1]
                    for h in range(3)
                )
                for t in range(1, 31)
            ]
        )
        peak = signal.argmax(0)
        cols = np.arange(8)
        expected = 1 - single[peak, cols] / signal[peak, cols]
        np.testing.assert_allclose(got[b], expected, rtol=1e-9, atol=1e-12)


@pytest.mark.float64
def test_example2_optimal_fidelity_matches_a_fine_grid():
    heads = example2_heads()
    # The grid of step 1e-5 on [0, 1] near its maximum: a grid of step 1e-3 finds it, and
    # the fine grid's points within 5e-3 of it (the same points) give its value.
    fidelity = lambda beta: metrics.minimax_fidelity(
        np.einsum("b,ij->bij", beta, heads[0]) + np.einsum("b,ij->bij", 1 - beta, heads[1]), 100
    )
    coarse = np.arange(1001) * 1e-3
    near = coarse[np.argmax(fidelity(coarse))] + (np.arange(1001) - 500) * 1e-5
    grid = fidelity(near[(near >= 0) & (near <= 1)])
    best = float(np.max(grid))
    np.testing.assert_allclose(best, 0.429788, atol=1e-6)
    weights, value = synergy.optimal_weights(heads, "fidelity")
    assert abs(float(value) - best) < 1e-4
    np.testing.assert_allclose(weights[0], 0.5787, atol=2e-3)
    np.testing.assert_allclose(
        metrics.minimax_fidelity(graphs.combine_heads(heads, weights)), value, rtol=1e-12
    )  # the value is the exact metric


@pytest.mark.float64
@pytest.mark.parametrize(
    "walk,head1,head2,mix,best",
    [
        ("normalized", 3.25, 2.875, 3.0357142857, 2.875),
        ("reference", 26.5, 50.375, 26.857142857, 26.5),
    ],
)
def test_example2_optimal_hitting_time_is_the_fastest_head(walk, head1, head2, mix, best):
    heads = example2_heads()
    ops = jnp.concatenate([heads, graphs.combine_heads(heads)[None]])
    np.testing.assert_allclose(metrics.hitting_time(ops, 100, walk), [head1, head2, mix], rtol=1e-9)
    weights, value = synergy.optimal_weights(heads, "hitting_time", walk)
    np.testing.assert_allclose(value, best, rtol=1e-9)
    np.testing.assert_allclose(weights, np.eye(2)[int(best == head2)], atol=1e-6)


@pytest.mark.float64
def test_optimal_weights_never_lose_to_a_start_and_batch_over_layers():
    attn = graphs.random_causal(5, (2, 3, 4), 10, scale=4.0, dtype=np.float64)
    init = np.array([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 1.0, 1.0]])
    weights, value = synergy.optimal_weights(attn, init=init, horizon=30, steps=30)
    assert weights.shape == (2, 4) and value.shape == (2,)
    for layer in range(2):
        a = attn[layer]
        fid = lambda w, a=a: float(
            np.mean(metrics.minimax_fidelity(graphs.combine_heads(a, w), 30))
        )
        np.testing.assert_allclose(fid(weights[layer]), value[layer], rtol=1e-12)
        starts = [np.full(4, 0.25), init[layer], *np.eye(4)]
        assert value[layer] >= max(fid(w) for w in starts) - 1e-15
        # The layer alone, as a batch of two copies of it (the programs of the batch):
        # what the other layer of a batch holds must not change a layer's search.
        twice = np.stack([a, a]), np.stack([init[layer], init[layer]])
        one, v1 = synergy.optimal_weights(twice[0], init=twice[1], horizon=30, steps=30)
        np.testing.assert_allclose(v1, value[layer], rtol=1e-12)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda a: synergy.optimal_weights(a, "speed"),
            r"objective must be one of \('fidelity', 'hitting_time'\), got 'speed'",
        ),
        (lambda a: synergy.optimal_weights(a, walk="lazy"), "walk must be one of"),
        (lambda a: synergy.optimal_weights(a, horizon=0), "horizon must be an integer >= 1, got 0"),
        (
            lambda a: synergy.optimal_weights(a, init=[1.0]),
            "init must have last dimension num_heads=2",
        ),
        (lambda a: synergy.optimal_weights(a, init=[-1.0, 2.0]), "init must be non-negative"),
        (lambda a: synergy.optimal_weights(a, init=[0.0, 0.0]), "init must not be all zero"),
        (
            lambda a: synergy.optimal_weights(a[0, 0]),
            r"attn must have shape \(N, H, T, T\) or \(H, T, T\)",
        ),
        (
            lambda a: synergy.cross_head_share(a, [1.0, 1.0, 1.0]),
            "weights must have last dimension num_heads=2",
        ),
        (
            lambda a: synergy.cross_head_share(a, [1.0, 1.0], horizon=0),
            "horizon must be an integer >= 1",
        ),
        (lambda a: synergy.head_diversity(a[0]), r"attn must have shape \(..., H, T, T\)"),
        (lambda a: synergy.head_diversity(a * 2), "attn rows must sum to 1"),
    ],
)
def test_bad_synergy_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call(example2_heads())


# ---------------------------------------------------------------- behaviours pinned down


def plain_rows(v0, mat, keep, steps):
    """v_t = (v_{t-1} mat) * keep by a Python loop: what autodiff differentiates directly."""
    out, v = [], v0
    for _ in range(steps):
        v = jnp.einsum("...i,...ij->...j", v, mat) * keep
        out.append(v)
    return jnp.stack(out, axis=-2)


@pytest.mark.float64
@pytest.mark.parametrize("steps", [1, 7])  # a single step (no recursion), and several
def test_row_recursion_gradient_equals_autodiff_of_the_loop(steps):
    """The custom VJP of `weighting.rows` against jax.grad of the plain loop, and against
    central finite differences of one entry, for a weighted sum of every iterate."""
    rng = np.random.default_rng(steps)
    mat = jnp.asarray(rng.random((3, 6, 6)))
    v0 = jnp.asarray(rng.random((3, 6)))
    keep = jnp.asarray((rng.random(6) > 0.3).astype(np.float64))
    g = jnp.asarray(rng.standard_normal((3, steps, 6)))

    def loss(fn):
        return lambda m: jnp.sum(fn(v0, m, keep, steps) * g)

    # Each side as one program, not op by op (as the weight search runs it, under jit).
    custom = jax.jit(jax.grad(loss(weighting.rows)))(mat)
    reference = jax.jit(jax.grad(loss(plain_rows)))(mat)
    np.testing.assert_allclose(custom, reference, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        weighting.rows(v0, mat, keep, steps),
        jax.jit(plain_rows, static_argnums=3)(v0, mat, keep, steps),
    )
    h = 1e-6
    bump = jnp.zeros_like(mat).at[1, 2, 3].set(h)
    plain_loss = jax.jit(loss(plain_rows))
    numeric = (plain_loss(mat + bump) - plain_loss(mat - bump)) / (2 * h)
    np.testing.assert_allclose(custom[1, 2, 3], numeric, rtol=1e-6)


@pytest.mark.float64
@pytest.mark.parametrize("t", [5, 13])  # causal T = 13: rows in blocks without later keys
@pytest.mark.parametrize("causal", [True, False])
def test_head_diversity_is_the_mean_over_head_pairs(t, causal):
    """H = 3 and 4: the mean over the H(H-1)/2 pairs and over rows of the TV distance,
    computed pair by pair in NumPy."""
    rng = np.random.default_rng(t)
    for h in (3, 4):
        attn = rng.random((2, h, t, t))
        attn = np.tril(attn) if causal else attn
        attn /= attn.sum(-1, keepdims=True)
        assert metrics.is_causal(attn) == causal
        pairs = [(i, j) for i in range(h) for j in range(i + 1, h)]
        want = np.mean(
            [[0.5 * np.abs(a[i] - a[j]).sum(-1).mean() for i, j in pairs] for a in attn], axis=1
        )
        np.testing.assert_allclose(synergy.head_diversity(attn), want, rtol=1e-12)


def test_cross_head_share_of_signals_is_the_share_of_the_layer_analysis():
    """The layer analysis takes the share from the sink signals of its metric sweep (the
    first mix and every head) instead of a second recursion: same numbers, and the
    first mix is the learned one, not the uniform mix beside it."""
    attn = graphs.random_causal(5, (2, 3), 10, dtype=np.float64)  # as the tests below
    w = np.array([0.2, 0.5, 0.3])
    spec = measure.MeasureSpec(horizon=30, max_steps=25, pairwise=False)
    out = measure.measure_layer(attn, w, spec)
    share = np.asarray(synergy.cross_head_share(attn, w, 30))
    np.testing.assert_allclose(out["cross_head_share_mean"], share.mean(-1), rtol=1e-5)
    uniform = np.asarray(synergy.cross_head_share(attn, np.ones(3), 30)).mean(-1)
    assert np.all(np.abs(uniform - share.mean(-1)) > 1e-3)
    np.testing.assert_allclose(out["head_diversity"], synergy.head_diversity(attn), rtol=1e-5)
    # The mix and every head in one call, as `cross_head_share` runs them: its program.
    mixed = graphs.combine_heads(attn, w)[:, None]
    signals = metrics.sink_signal(jnp.concatenate([mixed, jnp.asarray(attn)], 1), 30)
    from_signals = synergy.cross_head_share_of_signals(signals[:, 0], signals[:, 1:], w / w.sum())
    np.testing.assert_allclose(from_signals, share, rtol=1e-12)


def test_cross_head_share_uses_the_first_step_of_a_plateau():
    """T = 3, two heads, weights 1/2. Token 1 reads token 0 in both heads; the sink reads
    token 1 in head 1 and token 0 in head 2. Token 0's sink signal reaches 1 at t = 2 and
    stays there; the single-head part there is 1/4 + 1/4, so its share is 1/2 (at any
    later step of the plateau the single-head part is 2^(1-t) and the share tends to 1).
    Token 1: all of s_1[1] = 1/2 is head 1's edge, share 0; the sink gets no signal, 0."""
    head1 = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0]], float)
    head2 = np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0]], float)
    share = synergy.cross_head_share(np.stack([head1, head2]), np.array([0.5, 0.5]), horizon=20)
    np.testing.assert_allclose(share, [0.5, 0.0, 0.0], atol=1e-12)


def test_validate_false_skips_the_check_and_nothing_else():
    """Analyses check a layer's attention once and measure it several ways unchecked:
    the unchecked numbers must be the checked ones, and only the check may be skipped."""

    a = jnp.asarray(graphs.random_causal(3, (2, 3), 10), jnp.float32)
    w = jnp.asarray([0.5, 0.3, 0.2])
    pairs = [
        (lambda x, v: metrics.operator_metrics(x, 30, 30, 0.25, "normalized", validate=v)),
        (lambda x, v: metrics.hitting_time(x, 30, "reference", validate=v)),
        (lambda x, v: synergy.head_diversity(x, validate=v)),
        (lambda x, v: synergy.cross_head_share(x, w, 30, validate=v)),
        (lambda x, v: measure.operator_fields(x, measure.MeasureSpec(horizon=30), v)),
    ]
    for fn in pairs:
        jax.tree.map(np.testing.assert_array_equal, fn(a, False), fn(a, True))
        with pytest.raises(ValueError, match="rows must sum to 1"):
            fn(2 * a, True)
        fn(2 * a, False)  # unchecked: no error


def test_head_diversity_takes_a_known_causality(monkeypatch):
    """A caller that checked the attention passes its causality: no second pass, and the
    causal row blocks give the full computation's value."""
    attn = graphs.random_causal(5, (2, 3), 16)
    want = np.asarray(synergy.head_diversity(attn))
    for where in (metrics, metrics.operators):  # the public name and the kernels' own
        monkeypatch.setattr(where, "is_causal", lambda c: pytest.fail("causality checked again"))
    for hint in (True, False):
        got = synergy.head_diversity(attn, validate=False, causal=hint)
        np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.float64
def test_pairwise_synergy_measures_fidelity_within_its_horizon():
    """Within one step a token keeps only what the sink's row gives it: the pair's gain
    is then min_j of the mean of two sink rows minus the better head's min_j."""
    attn = graphs.random_causal(7, (2, 4), 6, dtype=np.float64)  # B x H x T x T
    rows = np.asarray(attn)[..., -1, :]  # B x H x T: each head's sink row
    alone = rows.min(-1)  # B x H
    mixed = (0.5 * (rows[:, :, None] + rows[:, None, :])).min(-1)  # B x H x H
    want = mixed - np.maximum(alone[:, :, None], alone[:, None, :])
    want[:, np.arange(4), np.arange(4)] = 0
    got = np.asarray(synergy.pairwise_synergy(attn, horizon=1))
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert not np.allclose(np.asarray(synergy.pairwise_synergy(attn)), want, atol=1e-6)


@pytest.mark.float64
def test_pairwise_synergy_of_heads_that_read_later_tokens():
    """Heads that are not causal (rows over every token) are measured as they are: each
    pair's gain is its own minimax fidelity minus its better head's. A bad horizon is
    named."""
    rows = np.random.default_rng(3).random((3, 6, 6)) ** 4 + 2 * np.triu(np.ones((6, 6)), 1)
    attn = rows / rows.sum(-1, keepdims=True)  # H x T x T, most mass on later tokens
    got = np.asarray(synergy.pairwise_synergy(attn, 40))
    alone = np.asarray(metrics.minimax_fidelity(attn, 40))
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        pair = metrics.minimax_fidelity(0.5 * (attn[i] + attn[j]), 40)
        want = float(pair) - max(alone[i], alone[j])
        assert got[i, j] == pytest.approx(want, abs=1e-12) and got[j, i] == got[i, j]
    with pytest.raises(ValueError, match="horizon"):
        synergy.pairwise_synergy(attn, 0)


@pytest.mark.float64
def test_pairwise_synergy_follows_mass_that_returns_to_later_tokens():
    """Heads that are not causal can send mass back to later tokens after the running
    minimum looks settled. With rows 0 -> 2, 1 -> 0 and the sink's row (0, p, 1 - p), token
    2 first gets 1 - p and one step later holds (1 - p)^2, below the running minimum
    1 - p, yet the step after that returns p to the sink through token 0: the fidelity is
    p (for p >= 1/2), not 1 - p. Each pair (the same pattern) is measured in full too, and
    every gain is the pair's own minimax fidelity minus its better head's."""
    ps = np.array([0.8, 0.7, 0.9, 0.6])
    attn = np.zeros((4, 3, 3))
    attn[:, 0, 2] = attn[:, 1, 0] = 1
    attn[:, 2, 1], attn[:, 2, 2] = ps, 1 - ps
    alone = np.asarray(metrics.minimax_fidelity(attn, 20))
    np.testing.assert_allclose(alone, ps, atol=1e-12)
    got = np.asarray(synergy.pairwise_synergy(attn, 20))
    for i in range(4):
        assert got[i, i] == 0
        for j in range(i + 1, 4):
            pair = float(metrics.minimax_fidelity(0.5 * (attn[i] + attn[j]), 20))
            assert pair == pytest.approx(0.5 * (ps[i] + ps[j]), abs=1e-12)
            want = pair - max(alone[i], alone[j])
            assert got[i, j] == pytest.approx(want, abs=1e-12) and got[j, i] == got[i, j]


def test_public_functions_take_attention_and_weights_by_the_same_keywords():
    """One name per concept across the public API: `attn`, `weights` and `importances`,
    as in graphs.combine_heads and synergy.optimal_weights."""
    attn = graphs.random_causal(3, (2, 3), 10, dtype=np.float64)  # shapes of the tests above
    w = np.array([0.25, 0.5, 0.25])
    np.testing.assert_array_equal(
        synergy.head_diversity(attn=attn, validate=True), synergy.head_diversity(attn)
    )
    np.testing.assert_array_equal(
        synergy.pairwise_synergy(attn=attn, horizon=30), synergy.pairwise_synergy(attn, 30)
    )
    np.testing.assert_array_equal(
        synergy.cross_head_share(attn=attn, weights=w, horizon=30),
        synergy.cross_head_share(attn, w, 30),
    )
    np.testing.assert_array_equal(
        graphs.combine_heads(attn=attn, weights=w), graphs.combine_heads(attn, w)
    )
    np.testing.assert_array_equal(graphs.sink_mass(attn=attn), graphs.sink_mass(attn))
    np.testing.assert_array_equal(
        graphs.drop_sink_tokens(attn=attn, sink_tokens=1), graphs.drop_sink_tokens(attn, 1)
    )
    layers = attn[None, :1]  # N x L x H x T x T
    assert pruning.fidelity_order(attn=layers, importances=[w], horizon=12) == (
        pruning.fidelity_order(layers, [w], 12)
    )
