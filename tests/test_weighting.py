"""Optimal head weights are optimal: at least the best of a dense grid (4 heads, the
paper's released checkpoint) and of 20,000 random Dirichlet mixes (16 heads, a
checkpoint trained here), for both objectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import checkpoints, graphs, metrics, model, synergy, tasks, weighting
from beyondpar.study import config_lib, train
from configs import smoke
from helpers.paths import DATA


def exact(attn_NxHxTxT, weights_SxH, objective, horizon=100, max_steps=None):
    """The mean objective over the N sets of each mix; `max_steps` defaults to `horizon`.
    Mixes of row-stochastic heads by weights on the simplex (checked here, on the host)
    are row-stochastic: the metrics skip their validation (one program less per shape).
    Mixes of causal heads are causal: checked once on the heads, not on every batch of
    mixes."""
    w = np.asarray(weights_SxH, np.float64)
    assert (w >= 0).all() and np.allclose(w.sum(-1), 1, rtol=0, atol=1e-4), w
    causal = metrics.is_causal(attn_NxHxTxT)
    weights = jnp.asarray(weights_SxH, attn_NxHxTxT.dtype)
    mixed = jnp.einsum("sh,...nhij->...snij", weights, attn_NxHxTxT)  # and layers first
    steps = horizon if max_steps is None else max_steps
    values = metrics.objective_unchecked(mixed, objective, horizon, steps, "reference", causal)
    return np.asarray(jnp.mean(values, -1))


def exact_one(attn_NxHxTxT, weights_H, objective, horizon, max_steps=None):
    """`exact` of one mix, scored beside a copy of itself: two mixes, the shape of a
    search's two best proposals (`local_starts` = 2), whose compiled programs it reuses."""
    pair = np.stack([np.asarray(weights_H)] * 2)
    return exact(attn_NxHxTxT, pair, objective, horizon, max_steps)[0]


# One search setting (three heads of nine tokens) for the tests of what a search returns:
# their searches share compiled programs (the searches of each set of eight, and of each
# subsample of three, compile once for the whole file).
SEARCH = dict(horizon=12, max_steps=14, search_sequences=3, local_rounds=4, random_starts=6)


def scores_of(attn_LxNxHxTxT, candidates, objective, horizon=100):
    """L x S: each candidate's score on each layer, in chunks as large as the pool of
    starts of a search with the default settings (uniform, every head, every pair, 64
    random mixes), so that they run the programs that the search compiled for its pool;
    padded with copies of the first candidate, whose scores are dropped."""
    h = candidates.shape[-1]
    chunk = 1 + h + h * (h - 1) // 2 + 64
    padding = -len(candidates) % chunk
    padded = np.concatenate([candidates, np.repeat(candidates[:1], padding, 0)])
    parts = np.split(padded, len(padded) // chunk)
    scores = np.concatenate([exact(attn_LxNxHxTxT, c, objective, horizon) for c in parts], -1)
    return scores[:, : len(candidates)]


def simplex_grid(heads: int, n: int) -> np.ndarray:
    points = [
        (a, b, c, n - a - b - c)
        for a in range(n + 1)
        for b in range(n + 1 - a)
        for c in range(n + 1 - a - b)
    ]
    assert heads == 4
    return np.asarray(points, np.float32) / n


@pytest.fixture(scope="module")
def released_4_heads():
    module, params = checkpoints.import_reference(DATA / "4_heads_copy.npz", 4)
    # 64 tokens: the shortest on the hitting time's triangular path, as the long ones. Two
    # sequences: every grid mix is scored on each, so the grid's cost is per sequence.
    examples = tasks.make_examples("cycle", jax.random.PRNGKey(3), 2, 64, 256)
    apply = jax.jit(model.apply_with_attention, static_argnums=0)  # not op by op
    _, attn = apply(module, params, examples.inputs)
    return np.swapaxes(np.asarray(attn, np.float32), 0, 1)[:2]  # layers 1-2: L x N x H x T x T


@pytest.mark.parametrize("objective", ["fidelity", "hitting_time"])
def test_optimum_reaches_a_dense_grid_on_the_released_checkpoint(released_4_heads, objective):
    weights, value = synergy.optimal_weights(released_4_heads, objective)
    grid = simplex_grid(4, 20)  # 1,771 mixes, steps of 1/20
    # Every layer's optimum scored among the grid's chunks: no program of its own.
    layers = len(released_4_heads)
    mixes = np.concatenate([np.asarray(weights), grid])
    scores = scores_of(jnp.asarray(released_4_heads), mixes, objective)
    for layer in range(layers):
        got = float(scores[layer, layer])
        grid_scores = scores[layer, layers:]
        best = grid_scores.max() if objective == "fidelity" else grid_scores.min()
        np.testing.assert_allclose(got, value[layer], rtol=1e-5)
        if objective == "fidelity":
            assert got >= best * (1 - 1e-6), (layer, got, best)
        else:
            assert got <= best * (1 + 1e-6), (layer, got, best)


def trained_attention(tmp_path_factory, heads):
    config = smoke.get_config(f"heads={heads}")
    config.task.name = "cycle"
    config.model.embed_dim = 32
    # One layer: trained heads the same, half the model to compile (the search of several
    # layers at once, split over the devices, has its own tests below).
    config.model.num_layers = 1
    config.evaluation.update(optimal_weights=False, pruning=False)
    # Only the last step's state is used: no earlier save, log or evaluation (they leave
    # the trained parameters as they are); it is the state the run returns, the one its
    # last checkpoint holds.
    config.update(checkpoint_every_steps=64, eval_every_steps=64, log_every_steps=64)
    folder = tmp_path_factory.mktemp(f"heads{heads}")
    params = train.train_and_evaluate(config, str(folder))["params"]
    module = model.Transformer(config_lib.model_config(config))
    # Six sequences: the search runs on all of them, and each random mix is scored on all.
    examples = tasks.make_examples("cycle", jax.random.PRNGKey(5), 6, 16, 16)
    apply = jax.jit(model.apply_with_attention, static_argnums=0)  # not op by op
    _, attn = apply(module, params, examples.inputs)
    return np.swapaxes(np.asarray(attn, np.float32), 0, 1)


@pytest.mark.slow
@pytest.mark.parametrize("heads", [16])
def test_optimum_beats_20000_random_mixes_on_trained_checkpoints(tmp_path_factory, heads):
    attn = trained_attention(tmp_path_factory, heads)
    mixes = np.random.default_rng(heads).dirichlet(np.ones(heads), 20000).astype(np.float32)
    for objective in weighting.OBJECTIVES:
        weights, value = synergy.optimal_weights(attn, objective, horizon=20, max_steps=20)
        scores = scores_of(jnp.asarray(attn), mixes, objective, horizon=20)
        for layer in range(len(attn)):
            best = scores[layer].max() if objective == "fidelity" else scores[layer].min()
            if objective == "fidelity":
                assert value[layer] >= best, (objective, layer, float(value[layer]), best)
            else:
                assert value[layer] <= best, (objective, layer, float(value[layer]), best)


def test_pattern_search_moves_towards_the_better_mix_and_halves_its_step(monkeypatch):
    """One start on two heads whose mixes score -(w0 - 0.3)^2 (a stand-in objective via a
    stub of the exact scorer): the search ends within the final step of w0 = 0.3."""
    calls = []

    def fake_scores(attn, candidates, **settings):
        calls.append(candidates.shape)
        return -((candidates[..., 0] - 0.3) ** 2)

    monkeypatch.setattr(weighting, "_exact_scores", fake_scores)
    start = jnp.asarray([[0.9, 0.1]])
    w, v = weighting.pattern_search(None, start, fake_scores(None, start), 1.0, 60, {})
    assert abs(float(w[0, 0]) - 0.3) < 2 * weighting._MIN_STEP
    assert float(v[0]) == pytest.approx(-((float(w[0, 0]) - 0.3) ** 2))
    assert calls[1] == (4, 2)  # 2H neighbours of one start, scored in one call
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.float64
def test_pattern_search_runs_until_every_start_has_settled(monkeypatch):
    """Two starts searched together end where each ends alone: the first starts at its
    optimum (its step halves to the smallest in nine rounds); the second's objective
    (its head 0's weight) improves every round, so it moves all 60 rounds."""
    at_optimum = lambda w: -((w[..., 0] - 0.3) ** 2)
    rising = lambda w: w[..., 0]

    def scorer(*objectives):  # the flat candidates are each start's 2H neighbours in turn
        return lambda attn, c, **settings: jnp.concatenate(
            [f(part) for f, part in zip(objectives, jnp.split(c, len(objectives)), strict=True)]
        )

    starts = jnp.asarray([[0.3, 0.7], [0.6, 0.4]])
    values = jnp.asarray([0.0, 0.6])
    monkeypatch.setattr(weighting, "_exact_scores", scorer(at_optimum, rising))
    w, v = weighting.pattern_search(None, starts, values, 1.0, 60, {})
    for i, objective in enumerate((at_optimum, rising)):
        monkeypatch.setattr(weighting, "_exact_scores", scorer(objective))
        w1, v1 = weighting.pattern_search(None, starts[i : i + 1], values[i : i + 1], 1.0, 60, {})
        np.testing.assert_array_equal(w[i], w1[0])
        np.testing.assert_array_equal(v[i], v1[0])
    assert float(w[1, 1]) < 1e-12  # 60 rounds of halving head 1's weight


def test_neighbours_stay_on_the_simplex():
    w = jnp.asarray([[0.5, 0.3, 0.2]])
    nb = weighting.neighbours(w, jnp.asarray([0.5]))
    assert nb.shape == (1, 6, 3)
    np.testing.assert_allclose(nb.sum(-1), 1.0, rtol=1e-6)
    assert np.all(np.asarray(nb) >= 0)
    np.testing.assert_allclose(nb[0, 0], [0.75, 0.15, 0.1])  # half-way towards head 0
    np.testing.assert_allclose(nb[0, 3], np.array([0.25, 0.3, 0.2]) / 0.75)  # half of head 0 off


def _uniform_or_identity(uniform_heads_per_set, num_heads=3, t=9):
    """N x H x T x T: head h of set n reads every earlier token evenly when h is listed
    for n, else only its own token (which keeps nothing of the other tokens)."""
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    sets = [
        [uniform if h in listed else np.eye(t) for h in range(num_heads)]
        for listed in uniform_heads_per_set
    ]
    return jnp.asarray(np.asarray(sets, np.float32))


def single_heads(attn_NxHxTxT):
    """Each of three heads' fidelity at horizon 12, scored after uniform weights: the four
    mixes that a search scores on every set (its anchors), whose programs it reuses."""
    anchors = np.vstack([np.full((1, 3), 1 / 3), np.eye(3)]).astype(np.float32)
    return exact(attn_NxHxTxT, anchors, "fidelity", 12)[1:]


# Eight sets whose subsample of three (sets 0, 4 and 7) favours heads 0 and 1, while on
# all eight head 2 is best: the sets of the searches above (their programs).
SUBSAMPLE_MISLEADS = [(0, 1), (2,), (2,), (2,), (0, 1), (2,), (2,), (0, 1)]


def test_every_single_head_is_scored_on_every_set():
    """The subsample favours heads 0 and 1; on all eight sets head 2 is best. The result
    must not be worse than head 2, even with no search at all."""
    attn = _uniform_or_identity(SUBSAMPLE_MISLEADS)
    heads = single_heads(attn)
    assert heads[2] > max(heads[0], heads[1])
    for rounds in (0, 4):
        w, value = synergy.optimal_weights(attn, "fidelity", **dict(SEARCH, local_rounds=rounds))
        assert float(value) >= heads[2] * (1 - 1e-6), (rounds, float(value), heads)


def test_the_value_is_the_exact_objective_on_every_set():
    """The search runs on a subsample; the value returned is the weights' score on all N."""

    attn = jnp.asarray(graphs.random_causal(7, (8, 3), 9), jnp.float32)
    for objective in weighting.OBJECTIVES:
        w, value = synergy.optimal_weights(attn, objective, **SEARCH)
        got = exact_one(attn, w, objective, 12, 14)
        np.testing.assert_allclose(float(value), got, rtol=1e-6)


# ---------------------------------------------------------------- scored out of sample


@pytest.mark.parametrize("num_sets, num_folds", [(48, 2), (7, 3), (5, 5), (1, 2), (3, 4)])
def test_folds_are_contiguous_blocks_that_cover_every_set_once(num_sets, num_folds):
    blocks = weighting.folds(num_sets, num_folds)
    assert len(blocks) == min(num_folds, num_sets)
    assert [i for b in blocks for i in b] == list(range(num_sets))
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize("num_sets, num_folds, per_fold", [(48, 2, 8), (7, 3, None), (10, 2, 3)])
def test_each_fold_searches_on_sets_outside_it_the_same_number_for_all(
    num_sets, num_folds, per_fold
):
    blocks = weighting.folds(num_sets, num_folds)
    picked = weighting.search_sets(num_sets, num_folds, per_fold)
    outside = [num_sets - len(b) for b in blocks]
    want = min(outside) if per_fold is None else min(min(outside), per_fold)
    assert [len(s) for s in picked] == [want] * len(blocks)
    for block, s in zip(blocks, picked, strict=True):
        assert not set(s.tolist()) & set(block), (block, s)
        assert len(set(s.tolist())) == len(s) and list(s) == sorted(s)
    # Evenly spaced over what lies outside: the first and the last set outside are used.
    outside_0 = [i for i in range(num_sets) if i not in blocks[0]]
    assert picked[0][0] == outside_0[0] and picked[0][-1] == outside_0[-1]


def test_a_single_set_is_searched_in_sample():
    assert [s.tolist() for s in weighting.search_sets(1, 2)] == [[0]]


def test_cross_fitted_weights_come_from_a_search_that_did_not_see_the_set():
    attn = jnp.asarray(graphs.random_causal(11, (6, 3), 9), jnp.float32)  # N x H x T x T
    found = weighting.cross_fitted(attn, 2, **SEARCH)
    assert found["held_out"] and found["fold"].tolist() == [0, 0, 0, 1, 1, 1]
    assert found["search_sets"] == [[3, 4, 5], [0, 1, 2]]
    for fold, sets in enumerate(found["search_sets"]):
        w, value = synergy.optimal_weights(attn[np.asarray(sets)], **SEARCH)
        np.testing.assert_allclose(found["fold_weights"][fold], w, atol=1e-6)
        np.testing.assert_allclose(found["in_sample"][fold], value, rtol=1e-6)
        # In sample: the search's own value is the mean fidelity of its mix on its sets.
        own = exact_one(attn[np.asarray(sets)], w, "fidelity", 12)
        np.testing.assert_allclose(found["in_sample"][fold], own, rtol=1e-5)
    np.testing.assert_allclose(
        found["weights"][:3], np.broadcast_to(found["fold_weights"][0], (3, 3))
    )
    np.testing.assert_allclose(
        found["weights"][3:], np.broadcast_to(found["fold_weights"][1], (3, 3))
    )


def test_the_search_subsamples_sequences_whatever_other_axes_the_batch_has(monkeypatch):
    """Layers x 8 sequences: the pool is ranked on 3 of the sequences of every layer,
    uniform, learned and every head on all 8 (axis -4, never the layer axis)."""
    seen = []
    scores = weighting._exact_scores

    def spy(attn, candidates, **settings):
        seen.append((attn.shape, candidates.shape))
        return scores(attn, candidates, **settings)

    monkeypatch.setattr(weighting, "_exact_scores", spy)
    # The layers and sets of the test of layers over devices below (its programs).
    attn = jnp.asarray(graphs.random_causal(5, (4, 8, 3), 9), jnp.float32)  # L x N x H x T x T
    weighting.optimal_weights(attn, **dict(SEARCH, local_rounds=0))
    sets = {shape[-4] for shape, _ in seen}
    assert sets == {3, 8}, seen
    assert all(shape[:-4] == (4,) and cand[:-2] == (4,) for shape, cand in seen)
    pool = [cand[-2] for shape, cand in seen if shape[-4] == 3]
    assert pool == [1 + 3 + 3 + 6]  # uniform, every head, every pair, random starts


def test_every_single_head_is_scored_on_every_set_beside_learned_weights():
    """As above, with learned weights among the starts: they take a place in the pool,
    never the last head's place among the anchors."""
    attn = _uniform_or_identity(SUBSAMPLE_MISLEADS)
    heads = single_heads(attn)
    init = np.asarray([1.0, 0.0, 0.0], np.float32)
    # Five random starts: with the learned weights, the pool of the searches above.
    settings = dict(SEARCH, local_rounds=0, random_starts=5)
    w, value = synergy.optimal_weights(attn, "fidelity", init=init, **settings)
    assert float(value) >= heads[2] * (1 - 1e-6), (float(value), heads)


@pytest.mark.parametrize(
    "num_sets, num_folds, sizes", [(7, 3, [2, 3, 2]), (8, 3, [3, 2, 3]), (10, 3, [3, 4, 3])]
)
def test_fold_edges_are_rounded_so_the_split_reads_the_same_from_either_end(
    num_sets, num_folds, sizes
):
    """The folds are stored with a corpus optimum and compared on a resumed run, so the
    split is fixed: edges at round(f N / F)."""
    assert [len(b) for b in weighting.folds(num_sets, num_folds)] == sizes


def test_a_single_fold_of_several_sets_is_in_sample():
    """The folds, their search sets and `held_out` come before any search: sets of one head
    (its own optimum, no search to compile) show them."""
    attn = graphs.random_causal(4, (3, 1), 9)  # N x 1 x T x T
    found = weighting.cross_fitted(attn, 1, horizon=12, local_rounds=0, random_starts=0)
    assert found["held_out"] is False and found["fold"].tolist() == [0, 0, 0]
    assert found["search_sets"] == [[0, 1, 2]]


def test_cross_fitting_every_layer_folds_the_sets_not_the_layers():
    """Layers x 6 sets: the folds split the 6 sets (axis -4) of every layer, and each
    layer's fold weights are those its own cross-fitting finds."""
    # Each layer alone is a problem of the shape of the test above (its programs).
    attn = jnp.asarray(graphs.random_causal(13, (2, 6, 3), 9), jnp.float32)  # L x N x H x T x T
    settings = dict(SEARCH, local_rounds=0)
    found = weighting.cross_fitted(attn, 2, **settings)
    assert found["fold"].tolist() == [0, 0, 0, 1, 1, 1]
    assert found["search_sets"] == [[3, 4, 5], [0, 1, 2]]
    assert found["weights"].shape == (2, 6, 3) and found["fold_weights"].shape == (2, 2, 3)
    alone = weighting.cross_fitted(attn[1], 2, **settings)
    fold_weights, in_sample = np.asarray(found["fold_weights"]), np.asarray(found["in_sample"])
    np.testing.assert_allclose(fold_weights[1], alone["fold_weights"], atol=1e-6)
    np.testing.assert_allclose(in_sample[1], alone["in_sample"], rtol=1e-6)


@pytest.mark.parametrize("objective", weighting.OBJECTIVES)
def test_layers_split_over_devices_give_each_layers_own_search(monkeypatch, objective):
    """4 layers (as many as the test's devices): each device mixes and scores its own
    layers; the weights and values are those of each layer searched alone, and the
    attention's causality is checked once per search, not per batch of mixes."""
    attn = jnp.asarray(graphs.random_causal(11, (4, 8, 3), 9), jnp.float32)
    settings = SEARCH
    checks = []
    real = metrics.is_causal
    count = lambda c: checks.append(c.shape) or real(c)
    for where in (metrics, metrics.operators):  # the public name and the kernels' own
        monkeypatch.setattr(where, "is_causal", count)
    w, value = weighting.optimal_weights(attn, objective, **settings)
    assert checks == [attn.shape]
    for layer in range(4):
        w1, v1 = weighting.optimal_weights(attn[layer], objective, **settings)
        np.testing.assert_allclose(w[layer], w1, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(value[layer], v1, rtol=1e-6)


@pytest.mark.parametrize("objective", weighting.OBJECTIVES)
def test_candidates_scored_in_chunks_keep_their_own_scores(monkeypatch, objective):
    """Candidates are mixed and scored a chunk at a time (bounded memory): whatever the
    chunk, each candidate's score is its own exact objective, every candidate scored."""
    attn = jnp.asarray(graphs.random_causal(12, (3, 3), 9), jnp.float32)  # N x H x T x T
    candidates = weighting.start_pool(3, None, (), jnp.float32, 6, 0)  # 13 mixes
    want = exact(attn, np.asarray(candidates), objective, 12, 14)
    per_candidate = 3 * 9 * 9
    for chunk in (1, 4, 64):
        monkeypatch.setattr(weighting, "_CHUNK_ENTRIES", chunk * per_candidate)
        got = weighting._exact_scores(
            attn, candidates, objective=objective, walk="reference", horizon=12, max_steps=14
        )
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"chunks of {chunk}")


def test_without_a_pattern_search_the_result_is_the_best_start_of_the_pool():
    """`local_rounds` = 0 with the search on every set: the result is the best of the
    pool (here a mix, neither uniform nor a single head), scored exactly."""
    # The sets and pool of each fold's search in the cross-fitting tests (their programs).
    attn = jnp.asarray(graphs.random_causal(28, (3, 3), 9), jnp.float32)
    pool = np.asarray(weighting.start_pool(3, None, (), jnp.float32, 6, 0))
    for objective in weighting.OBJECTIVES:
        scores = exact(attn, pool, objective, 12, 14)
        best = np.argmax(scores) if objective == "fidelity" else np.argmin(scores)
        assert best > 3, (objective, best)  # not an anchor: only the search's pick has it
        w, value = synergy.optimal_weights(
            attn, objective, horizon=12, max_steps=14, random_starts=6, local_rounds=0
        )
        np.testing.assert_allclose(float(value), scores[best], rtol=1e-6, err_msg=objective)
        np.testing.assert_allclose(w, pool[best], atol=1e-7, err_msg=objective)


def test_one_problem_with_as_many_sets_as_devices_searches_a_subsample_of_them():
    """8 sets of one problem on the 4 test devices, searched on 3 of them: the sets stay
    together (only independent problems are split over the devices), and the value is
    the exact objective of the weights on all 8."""
    attn = jnp.asarray(graphs.random_causal(14, (8, 3), 9), jnp.float32)
    w, value = synergy.optimal_weights(attn, **SEARCH)
    got = exact_one(attn, w, "fidelity", 12)
    np.testing.assert_allclose(float(value), got, rtol=1e-6)


@pytest.mark.parametrize("objective", ["fidelity", "hitting_time"])
def test_surrogate_descent_improves_the_exact_objective_from_uniform(objective):
    """Adam on the smooth surrogate must move the mix the right way: from uniform weights
    on random causal sets, the weights it returns have a higher exact minimax fidelity (or
    a lower exact hitting time) than uniform, and they stay on the simplex."""
    rng = np.random.default_rng(3)
    x = np.tril(rng.gamma(0.3, size=(3, 3, 6, 6)) + 1e-3)
    attn = jnp.asarray(x / x.sum(-1, keepdims=True), jnp.float32)
    settings = dict(objective=objective, walk="reference", horizon=20, max_steps=20)
    uniform = jnp.full((1, 3), 1 / 3, jnp.float32)
    found = weighting._descend(attn, uniform, steps=60, learning_rate=0.1, **settings)
    np.testing.assert_allclose(np.asarray(found).sum(-1), 1.0, rtol=1e-5)
    before, after = np.asarray(
        weighting._exact_scores(attn, jnp.concatenate([uniform, found]), **settings)
    )
    if objective == "fidelity":
        assert after > before * 1.02
    else:
        assert after < before * 0.98


def test_per_fold_below_one_is_rejected_not_an_empty_search():
    """A fold searched on no set has no optimum: per_fold = 0 is a ValueError naming the
    argument, from search_sets and from cross_fitted, not an empty or NaN result."""
    with pytest.raises(ValueError, match="per_fold"):
        weighting.search_sets(6, 2, per_fold=0)
    attn = np.broadcast_to(np.eye(3, dtype=np.float32), (4, 2, 3, 3)).copy()
    attn[..., 2, :] = 1.0 / 3  # four sets of two heads whose sink reads every token
    with pytest.raises(ValueError, match="per_fold"):
        weighting.cross_fitted(attn, num_folds=2, per_fold=0, random_starts=2, local_rounds=0)


@pytest.mark.parametrize("random_starts", [1, 5, 7])
def test_start_pool_holds_every_requested_random_start_for_odd_counts(random_starts):
    """The pool is uniform, each head, each 50/50 pair and then exactly `random_starts`
    random mixes, odd counts included (dense and sparse halves differ by one): 1 + 3 + 3 +
    r rows for three heads, every row a distribution over the heads."""
    pool = np.asarray(weighting.start_pool(3, None, (), jnp.float32, random_starts, 1))
    assert pool.shape == (1 + 3 + 3 + random_starts, 3)
    np.testing.assert_allclose(pool.sum(-1), 1.0, rtol=1e-6)
    assert (pool >= 0).all()
    np.testing.assert_allclose(pool[1:4], np.eye(3))
    np.testing.assert_allclose(pool[4:7], [[0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])


def test_start_pool_normalises_unnormalised_learned_weights():
    """Learned importances (e.g. projection norms 2, 1, 1) enter the pool as the mix
    (1/2, 1/4, 1/4), right after uniform: a start is a convex mix, whatever init's scale."""
    init = np.array([2.0, 1.0, 1.0], np.float32)
    pool = np.asarray(weighting.start_pool(3, init, (2,), jnp.float32, 4, 0))
    assert pool.shape == (2, 1 + 1 + 3 + 3 + 4, 3)
    np.testing.assert_allclose(pool[:, 1], [[0.5, 0.25, 0.25]] * 2, rtol=1e-6)
    np.testing.assert_allclose(pool.sum(-1), 1.0, rtol=1e-6)


# Two causal heads of two tokens whose sink reads token 0 with weight 1/5 and 3/5.
TWO_CAUSAL_HEADS = np.array([[[1, 0], [0.2, 0.8]], [[1, 0], [0.6, 0.4]]], np.float32)


def test_optimal_weights_with_unnormalised_init_returns_a_convex_mix():
    """Two causal heads whose sink reads token 0 with weight p = 1/5 and 3/5: a mix has
    p = (w0 + 3 w1) / 5 and minimax fidelity min(1 - (1 - p)^K, 1 - p) = 1 - p, best at
    head 0 alone (4/5). Learned weights (3, 1) given unnormalised and the search off: the
    answer is still a mix summing to 1, head 0, with the exact value 4/5."""
    a = TWO_CAUSAL_HEADS
    w, value = weighting.optimal_weights(
        a, init=np.array([3.0, 1.0], np.float32), random_starts=0, local_rounds=0, horizon=50
    )
    np.testing.assert_allclose(float(jnp.sum(w)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(w, [1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(float(value), 0.8, rtol=1e-5)


# The loss as the descent runs it, one program per walk (op by op, each step compiles).
surrogate = jax.jit(
    weighting._surrogate, static_argnames=("objective", "walk", "horizon", "max_steps")
)


@pytest.mark.parametrize(
    "walk, expected",
    [
        # normalised walk: token 0 moves to the sink w.p. 1/3 per step, S_t[0] = (2/3)^t
        ("normalized", 0.5 * 3 * (1 - (2 / 3) ** 5)),
        # reference walk: column 0 holds 1 at token 0, so token 0 never leaves: K / T
        ("reference", 5 / 2),
    ],
    ids=["normalized", "reference"],
)
@pytest.mark.parametrize("temperature", [1e-2, 1.0])
def test_hitting_time_surrogate_is_exact_at_a_short_horizon(walk, expected, temperature):
    """The hitting-time loss of the descent is the exact mean hitting time (it needs no
    smoothing): for C = 1/2 [[1, 0], [1, 0]] + 1/2 [[1, 0], [0, 1]] = [[1, 0], [1/2, 1/2]]
    and K = 5 steps, h = (1/T) sum_{t<K} S_t[0], whatever the temperature."""
    attn = jnp.asarray([[[[1, 0], [1, 0]], [[1, 0], [0, 1]]]], jnp.float32)
    mix = jnp.asarray([[0.5, 0.5]], jnp.float32)
    loss = surrogate(
        attn, mix, temperature, objective="hitting_time", walk=walk, horizon=7, max_steps=5
    )
    np.testing.assert_allclose(np.asarray(loss), [expected], rtol=1e-5)
    exact = metrics.hitting_time(jnp.einsum("nh,nhij->nij", mix, attn), 5, walk)
    np.testing.assert_allclose(np.asarray(exact), [expected], rtol=1e-5)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf"), "0.1", True])
def test_a_learning_rate_that_is_not_a_positive_number_is_rejected(rate):
    """The surrogate descent steps against its loss's gradient by the learning rate: zero
    never moves, a negative rate climbs the loss and NaN or infinity ruins every start, so
    each is an error naming the argument before any search runs."""
    a = TWO_CAUSAL_HEADS
    with pytest.raises(ValueError, match=r"learning_rate must be a finite number > 0, got"):
        weighting.optimal_weights(a, steps=3, learning_rate=rate)
    with pytest.raises(ValueError, match="learning_rate must be a finite number > 0"):
        weighting.cross_fitted(np.stack([a, a]), num_folds=2, steps=3, learning_rate=rate)


@pytest.mark.parametrize(
    ("argument", "value", "bound"),
    [
        ("max_steps", 0, ">= 1"),
        ("search_sequences", 0, ">= 1"),
        ("random_starts", -1, ">= 0"),
        ("steps", -2, ">= 0"),
        ("local_rounds", -1, ">= 0"),
    ],
)
def test_optimal_weights_rejects_counts_out_of_range_by_name(argument, value, bound):
    """A walk of no steps, a search over no sets and a negative number of starts, steps or
    rounds describe no search at all: each is an error that names the argument and its
    bound, raised before anything is scored, not an empty or silently shortened search."""
    settings = dict(horizon=7, max_steps=5, local_rounds=0, random_starts=2)
    settings[argument] = value
    message = rf"{argument} must be an integer {bound}, got {value}"
    with pytest.raises(ValueError, match=message):
        weighting.optimal_weights(TWO_CAUSAL_HEADS, "hitting_time", **settings)


@pytest.mark.parametrize("objective", ["fidelity", "hitting_time"])
def test_one_head_is_its_own_optimum_without_a_search(monkeypatch, objective):
    """One head: weights exactly 1 for every problem, the value that head's own objective
    (mean over the sets), and no candidate proposed or polished; a bad `init` is still
    refused."""

    def no_search(*args, **kwargs):
        raise AssertionError("searched a one-head problem")

    monkeypatch.setattr(weighting, "_propose", no_search)
    monkeypatch.setattr(weighting, "pattern_search", no_search)
    attn = graphs.random_causal(4, (2, 3, 1), 9)  # L x N x 1 x T x T
    w, value = weighting.optimal_weights(attn, objective, horizon=20, max_steps=20)
    np.testing.assert_array_equal(np.asarray(w), np.ones((2, 1)))
    # L x 1 x N: the head's values in the shape the problem's own scoring has (its program).
    head = np.swapaxes(attn, 1, 2)
    if objective == "fidelity":
        own = metrics.minimax_fidelity(head, horizon=20)
    else:
        own = metrics.hitting_time(head, max_steps=20)
    np.testing.assert_allclose(np.asarray(value), np.asarray(own)[:, 0].mean(-1), rtol=1e-6)
    with pytest.raises(ValueError, match="init"):
        weighting.optimal_weights(attn, objective, init=np.zeros((2, 1), np.float32))


def test_start_pool_random_starts_follow_the_seed():
    """The anchors (uniform, every head, every pair: 7 rows for 3 heads) are fixed; the
    random starts are the seed's: equal for one seed, different for another."""
    pools = [np.asarray(weighting.start_pool(3, None, (), jnp.float32, 6, s)) for s in (0, 0, 1)]
    np.testing.assert_array_equal(pools[0], pools[1])
    np.testing.assert_array_equal(pools[0][:7], pools[2][:7])
    assert np.abs(pools[0][7:] - pools[2][7:]).min() > 1e-6


@pytest.mark.float64
def test_one_head_optimum_keeps_the_attentions_dtype():
    """float32 attention with x64 on: the one head's weight and value stay float32, as a
    search's would."""
    attn = graphs.random_causal(4, (3, 1), 9).astype(np.float32)
    w, value = weighting.optimal_weights(attn, horizon=20, max_steps=20)
    assert (w.dtype, value.dtype) == (jnp.float32, jnp.float32)
    np.testing.assert_array_equal(np.asarray(w), [1.0])


def test_a_moving_start_keeps_its_step_at_most_one_half():
    """Uniform causal attention against staying put on 6 tokens: the fidelity grows with
    the uniform head's weight (checked on the mixes the search meets), so from (1/2, 1/2)
    each round moves towards it: to (3/4, 1/4), then, the step doubled but held at 1/2,
    to (7/8, 1/8); a step let grow to 1 would jump onto the vertex."""
    t = 6
    uniform = np.tril(np.ones((t, t), np.float32))
    uniform /= uniform.sum(-1, keepdims=True)
    attn = np.stack([uniform, np.eye(t, dtype=np.float32)])[None]  # one set of two heads
    w0 = np.asarray([0.5, 2 / 3, 0.75, 6 / 7, 0.875, 1.0], np.float32)
    mixes = np.stack([w0, 1 - w0], -1)
    # Four at a time, as the search scores a start's 2H neighbours (its program).
    four = lambda m: exact(attn, m, "fidelity", 20)
    fidelity = np.concatenate([four(mixes[:4]), four(mixes[2:])[2:]])
    assert np.all(np.diff(fidelity) > 0), fidelity
    settings = dict(objective="fidelity", walk="reference", horizon=20, max_steps=20)
    start = jnp.asarray([[0.5, 0.5]], jnp.float32)
    weights, value = weighting.pattern_search(
        jnp.asarray(attn), start, jnp.asarray(fidelity[:1]), 1.0, 2, settings
    )
    np.testing.assert_array_equal(weights, [[0.875, 0.125]])
    np.testing.assert_allclose(value, fidelity[4:5], rtol=1e-6)
