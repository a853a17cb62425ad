"""The head weights that serve the sink best: `optimal_weights`.

The exact objective (mean minimax fidelity, or mean hitting time, of the mixed operators)
is cheap to evaluate and batches well: thousands of candidate mixes are one kernel call,
and H is at most a few dozen. So the search is on the exact metric:

1. a pool of starts: uniform, the learned weights, every head, every 50/50 pair, and
   seeded random mixes, dense and sparse (Dirichlet), scored exactly on an evenly spaced
   subsample of the sets (the objective is a mean over sets, so its optimum moves
   little); uniform, learned and every head are also scored on every set;
2. optionally (`steps` > 0), Adam on a smooth surrogate from the best start (weights =
   softmax of logits; max over steps and min over tokens as temperature-scaled
   log-sum-exp, the temperature annealed towards the exact metric): one more proposal
   (it rarely beats the pool, and costs as much as it);
3. a pattern search on the exact metric, on the subsample, from the best few proposals:
   at each round every start tries moving a share of its mass towards each head and
   away from each head (2H neighbours), takes the best neighbour if it improves
   (doubling its step), and halves its step otherwise;
4. the best of the search results and the anchors on every set, polished there by a
   short pattern search with small steps.

The result is scored on every set and is never worse than uniform weights, the learned
weights or any single head.

An optimum scored on the sets it was searched on flatters itself. `cross_fitted` scores it
out of sample: the sets are split into contiguous folds, each fold's weights are searched
on sets outside it, and every set is measured with the weights of the search that did not
see it; the searches' own values (in sample) are returned beside them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from beyondpar import graphs, metrics
from beyondpar.base import checks, parallel

OBJECTIVES = ("fidelity", "hitting_time")
_FLOOR = 1e-6  # the smallest weight a start of the descent gives a head
_MIN_STEP = 1.0 / 512  # the pattern search stops when every start's step is below this
_POLISH_SHARE = 3  # the polish on every set runs local_rounds / this many rounds


def optimal_weights(
    attn,
    objective: str = "fidelity",
    walk: str = "reference",
    horizon: int = 100,
    max_steps: int = 100,
    init=None,
    steps: int = 0,
    learning_rate: float = 0.1,
    random_starts: int = 64,
    local_starts: int = 2,
    local_rounds: int = 24,
    search_sequences: int = 12,
    seed: int = 0,
):
    """(weights (H,), value): the head mix maximising the mean minimax fidelity, or
    minimising the mean hitting time, of the mixed operators of the N attention sets in
    `attn` (N x H x T x T, or H x T x T for one set).

    Extra leading axes (e.g. L x N x H x T x T for every layer of a model) are independent
    problems solved in one batch: weights (..., H) and values (...). `init` (e.g. the
    learned importances, shape (..., H)) joins the starts; `steps` = 0 skips the surrogate
    descent, `local_rounds` = 0 the pattern search, which runs from the `local_starts` best
    candidates on `search_sequences` of the N sets and is polished on all of them; `seed`
    fixes the random starts.
    """
    objective = checks.one_of("objective", objective, OBJECTIVES)
    walk = checks.one_of("walk", walk, metrics.WALKS)
    horizon = checks.positive_int("horizon", horizon)
    max_steps = checks.positive_int("max_steps", max_steps)
    counts = dict(steps=steps, random_starts=random_starts, local_rounds=local_rounds)
    for name, value in counts.items():
        checks.non_negative_int(name, value)
    local_starts = checks.positive_int("local_starts", local_starts)
    learning_rate = checks.positive_number("learning_rate", learning_rate)
    search_sequences = checks.positive_int("search_sequences", search_sequences)
    a = _check_attn(attn)
    settings = dict(objective=objective, walk=walk, horizon=horizon, max_steps=max_steps)
    # Checked once: every mix of causal heads is causal, and the scoring of each batch of
    # mixes would otherwise check it again.
    settings["causal"] = metrics.is_causal(a)
    sign = 1.0 if objective == "fidelity" else -1.0
    num_heads = a.shape[-3]
    pool = start_pool(num_heads, init, a.shape[:-4], a.dtype, random_starts, seed)  # checks init
    if num_heads == 1:
        return _only_head(a, settings)
    sub = _subsample(a, search_sequences)
    # Anchors (uniform, learned, every head) are scored on every set, the rest of the
    # pool only on the subsample that the search runs on.
    anchors = pool[..., : num_heads + (1 if init is None else 2), :]
    search = dict(steps=steps, learning_rate=learning_rate, local_starts=local_starts)
    proposals = _propose(sub, pool, sign, local_rounds, settings, **search)
    candidates = jnp.concatenate([anchors, proposals], axis=-2)
    scores = [_exact_scores(a, anchors, **settings), _exact_scores(a, proposals, **settings)]
    weights, value = _top(candidates, jnp.concatenate(scores, axis=-1), sign, 1)
    if local_rounds:  # polished on every set with small steps
        weights, value = pattern_search(
            a, weights, value, sign, local_rounds // _POLISH_SHARE, settings, 1 / 16
        )
    return weights[..., 0, :], value[..., 0]


def _only_head(attn, settings: dict):
    """`optimal_weights` of one-head problems: the only mix is the head itself (weight 1),
    scored as the search would score it, without compiling the search."""
    only = jnp.ones((*attn.shape[:-4], 1, 1), attn.dtype)
    return only[..., 0, :], _exact_scores(attn, only, **settings)[..., 0]


def folds(num_sets: int, num_folds: int) -> list[range]:
    """`num_folds` contiguous blocks of the sets in their order (fewer when there are fewer
    sets): neighbouring windows of a document stay together, so a held-out fold is not
    seen through its neighbours."""
    checks.positive_int("num_sets", num_sets)
    num_folds = min(checks.positive_int("num_folds", num_folds), num_sets)
    edges = np.linspace(0, num_sets, num_folds + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def search_sets(num_sets: int, num_folds: int, per_fold: int | None = None) -> list[np.ndarray]:
    """For each fold, the sets its weights are searched on: evenly spaced among the sets
    outside the fold, at most `per_fold`, the same number for every fold (so that all
    folds search in one batched call). One fold (a single set): every set, in sample."""
    blocks = folds(num_sets, num_folds)
    everything = np.arange(num_sets)
    if len(blocks) == 1:
        outside = [everything]
    else:
        outside = [np.setdiff1d(everything, np.asarray(block)) for block in blocks]
    count = min(len(o) for o in outside)
    if per_fold is not None:
        count = min(count, checks.positive_int("per_fold", per_fold))
    return [o[np.linspace(0, len(o) - 1, count).round().astype(int)] for o in outside]


def cross_fitted(attn, num_folds: int = 2, per_fold: int | None = None, **search) -> dict:
    """Optimal weights scored out of sample, for attention sets `attn` (..., N, H, T, T).

    Returns `weights` (..., N, H): each set's weights, searched without its fold; `fold`
    (N,); `fold_weights` (..., F, H); `in_sample` (..., F): each search's objective on the
    sets it was searched on; `search_sets` [F x S]; `held_out` False when there is a single
    set (nothing to hold out: its weights are in sample). `search` goes to
    `optimal_weights` (objective, init, ...).
    """
    a = _check_attn(attn)
    n = a.shape[-4]
    blocks = folds(n, num_folds)
    picked = search_sets(n, num_folds, per_fold)
    stacked = jnp.stack([jnp.take(a, jnp.asarray(s), axis=-4) for s in picked], axis=-5)
    weights, values = optimal_weights(stacked, **search)
    fold = np.concatenate([np.full(len(b), f) for f, b in enumerate(blocks)])
    return {
        "weights": jnp.take(weights, jnp.asarray(fold), axis=-2),
        "fold": fold,
        "fold_weights": weights,
        "in_sample": values,
        "search_sets": [s.tolist() for s in picked],
        "held_out": len(blocks) > 1,
    }


def _check_attn(attn):
    """Attention sets as (..., N, H, T, T), rows checked once for the whole search."""
    a = checks.as_float_array("attn", attn)
    if a.ndim < 3:
        raise ValueError(f"attn must have shape (N, H, T, T) or (H, T, T), got shape {a.shape}")
    if a.ndim == 3:
        a = a[None]
    a = metrics.check_operator(a, "attn")
    # Independent problems (e.g. layers) go to their own devices.
    return parallel.split_first_axis(a) if a.ndim > 4 else a


def _propose(sub, pool, sign, local_rounds, settings, *, steps, learning_rate, local_starts):
    """The best `local_starts` of the pool on the subsample (and of the surrogate descent,
    with `steps` > 0), improved there by the pattern search."""
    proposals, proposal_scores = pool, _exact_scores(sub, pool, **settings)
    if steps:
        best = _top(proposals, proposal_scores, sign, 1)[0]
        smooth = {k: v for k, v in settings.items() if k != "causal"}  # any operator
        found = _descend(sub, best, steps=steps, learning_rate=learning_rate, **smooth)
        proposals = jnp.concatenate([proposals, found], axis=-2)
        found_scores = _exact_scores(sub, found, **settings)
        proposal_scores = jnp.concatenate([proposal_scores, found_scores], axis=-1)
    w0, v0 = _top(proposals, proposal_scores, sign, local_starts)
    if not local_rounds:
        return w0
    return pattern_search(sub, w0, v0, sign, local_rounds, settings)[0]


def _subsample(a, sequences: int):
    """An evenly spaced subsample of `sequences` attention sets (the objective is a mean
    over sets, so its optimum moves little); all of them when there are no more."""
    n = a.shape[-4]
    picked = np.unique(np.linspace(0, n - 1, min(sequences, n)).round().astype(int))
    if len(picked) == n:
        return a
    # On the host: indexing a batch split over devices would need an all-to-all. Put
    # back as `a` was: problems split over devices stay split.
    sub = np.take(np.asarray(a), picked, axis=-4)
    return jax.device_put(sub, a.sharding) if len(a.sharding.device_set) > 1 else jnp.asarray(sub)


def start_pool(num_heads: int, init, lead: tuple, dtype, random_starts: int, seed: int):
    """(..., S, H): uniform, `init` when given, every head, every 50/50 pair, then random
    mixes, half dense (Dirichlet 1) and half sparse (Dirichlet 0.2)."""
    h = num_heads
    rows = [np.full((1, h), 1.0 / h), np.eye(h)]
    i, j = np.triu_indices(h, 1)
    pairs = np.zeros((len(i), h))
    pairs[np.arange(len(i)), i] = pairs[np.arange(len(i)), j] = 0.5
    rng = np.random.default_rng(seed)
    dense = rng.dirichlet(np.ones(h), random_starts - random_starts // 2)
    sparse = rng.dirichlet(np.full(h, 0.2), random_starts // 2)
    rows += [pairs, dense, sparse]
    pool = jnp.broadcast_to(jnp.asarray(np.vstack(rows), dtype), (*lead, sum(map(len, rows)), h))
    if init is None:
        return pool
    learned = graphs.normalize_weights(init, h, "init").astype(dtype)
    learned = jnp.broadcast_to(learned, (*lead, h))[..., None, :]
    return jnp.concatenate([pool[..., :1, :], learned, pool[..., 1:, :]], axis=-2)


@functools.partial(jax.jit, static_argnames=("sign", "k"))
def _top(candidates, scores, sign: float, k: int):
    """The k best candidates (..., k, H) and their scores (..., k)."""
    order = jnp.argsort(-sign * scores, axis=-1)[..., :k]
    return (
        jnp.take_along_axis(candidates, order[..., None], axis=-2),
        jnp.take_along_axis(scores, order, axis=-1),
    )


@jax.jit
def neighbours(weights, step):
    """(..., K, 2H, H): each start moved a share `step` (..., K) of the way towards each
    head's vertex, and with a share `step` of each head's own weight removed."""
    h = weights.shape[-1]
    eye = jnp.eye(h, dtype=weights.dtype)
    w = weights[..., None, :]
    s = step[..., None, None]
    towards = (1 - s) * w + s * eye
    away = w - s * w * eye
    away = away / jnp.sum(away, axis=-1, keepdims=True)
    return jnp.concatenate([towards, away], axis=-2)


def pattern_search(attn, starts, values, sign: float, rounds: int, settings: dict, step=0.5):
    """Improve every start (..., K, H) on the exact objective: per round all 2H neighbours
    of every start are scored in one call; a start moves to its best neighbour when that
    improves it (and doubles its step, up to 1/2), else halves its step. Returns the final
    weights and their scores."""
    w, v = starts, values
    step = jnp.full(v.shape, step, v.dtype)
    k, h = w.shape[-2], w.shape[-1]
    for _ in range(rounds):
        nb = neighbours(w, step)
        flat = nb.reshape(*nb.shape[:-3], k * 2 * h, h)
        s = _exact_scores(attn, flat, **settings)
        w, v, step, done = _move(nb, s, w, v, step, sign)
        if bool(done):
            break
    return w, v


@functools.partial(jax.jit, static_argnames="sign")
def _move(nb, scores, w, v, step, sign: float):
    """One round's moves: each start (..., K, H) to its best neighbour of `nb` (..., K, 2H,
    H, with flat `scores` (..., K * 2H)) when it improves, its step doubled (up to 1/2),
    else halved; and whether every step is now below the smallest. One compiled program
    per shape rather than a dozen small ones."""
    s = scores.reshape(*nb.shape[:-1])
    pick = jnp.argmax(sign * s, axis=-1)
    best_s = jnp.take_along_axis(s, pick[..., None], axis=-1)[..., 0]
    best_w = jnp.take_along_axis(nb, pick[..., None, None], axis=-2)[..., 0, :]
    better = sign * best_s > sign * v
    w = jnp.where(better[..., None], best_w, w)
    v = jnp.where(better, best_s, v)
    step = jnp.where(better, jnp.minimum(2 * step, 0.5), step / 2)
    return w, v, step, jnp.all(step < _MIN_STEP)


_CHUNK_ENTRIES = 2**25  # mixed operators per scoring call: 128 MB in float32


def _exact_scores(attn, candidates, *, objective, walk, horizon, max_steps, causal=None):
    """Exact objective of every candidate mix (..., S, H) -> (...), mean over N. The mixes
    of checked attention rows are row-stochastic, so the kernels skip their validation
    (and their causality check when `causal` is known); candidates go in chunks so the
    mixed operators stay within a fixed memory."""
    per_candidate = int(np.prod(attn.shape[:-3])) * attn.shape[-1] ** 2
    chunk = max(1, _CHUNK_ENTRIES // max(per_candidate, 1))
    out = []
    for start in range(0, candidates.shape[-2], chunk):
        part = candidates[..., start : start + chunk, :]
        mixed = jnp.einsum("...sh,...nhij->...snij", part, attn)
        values = metrics.objective_unchecked(mixed, objective, horizon, max_steps, walk, causal)
        out.append(np.asarray(jnp.mean(values, axis=-1)))
    # Scores come back split over devices; on the host they stay out of later collectives.
    return jnp.asarray(np.concatenate(out, axis=-1))


@functools.partial(jax.jit, static_argnames=("objective", "walk", "horizon", "max_steps", "steps"))
def _descend(attn, starts, *, objective, walk, horizon, max_steps, steps, learning_rate):
    """Adam on softmax logits from every start at once. The temperature of the smooth
    min / max falls geometrically from 1e-2 to 1e-4 so the last steps see the metric, and
    the step size decays (cosine) so the iterates settle on its kink."""
    logits0 = jnp.log(jnp.maximum(starts, _FLOOR))
    tx = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=1e-3))
    loss = functools.partial(
        _surrogate, attn, objective=objective, walk=walk, horizon=horizon, max_steps=max_steps
    )
    temperatures = jnp.geomspace(1e-2, 1e-4, steps).astype(attn.dtype)

    def step(carry, temperature):
        logits, opt_state = carry
        grads = jax.grad(lambda z: jnp.sum(loss(jax.nn.softmax(z), temperature)))(logits)
        updates, opt_state = tx.update(grads, opt_state)
        return (optax.apply_updates(logits, updates), opt_state), None

    (logits, _), _ = lax.scan(step, (logits0, tx.init(logits0)), temperatures)
    return jax.nn.softmax(logits)


def _surrogate(attn, weights, temperature, *, objective, walk, horizon, max_steps):
    """Smooth loss per start (... x S): minus soft minimax fidelity, or hitting time."""
    mixed = jnp.einsum("...sh,...nhij->...snij", weights, attn)
    t = mixed.shape[-1]
    sink = jax.nn.one_hot(t - 1, t, dtype=mixed.dtype)
    if objective == "fidelity":
        signal = rows(jnp.broadcast_to(sink, mixed.shape[:-1]), mixed, jnp.ones_like(sink), horizon)
        phi = temperature * jax.nn.logsumexp(signal / temperature, axis=-2)
        soft_min = -temperature * jax.nn.logsumexp(-phi / temperature, axis=-1)
        return -jnp.mean(soft_min, axis=-1)
    walk_cols = jnp.swapaxes(metrics.transition_matrix(mixed, walk), -1, -2)
    off_sink = 1 - sink
    alive0 = jnp.broadcast_to(off_sink, mixed.shape[:-1])
    survival = rows(alive0, walk_cols, off_sink, max_steps - 1) if max_steps > 1 else None
    hit = jnp.sum(alive0, -1) + (0 if survival is None else jnp.sum(survival, axis=(-2, -1)))
    return jnp.mean(hit / t, axis=-1)


# ---------------------------------------------------------------- a differentiable recursion


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def rows(v0, mat, keep, steps: int):
    """v_t = (v_{t-1} mat) * keep for t = 1..steps (... x steps x T), differentiable in `mat`.

    Autodiff of the loop would add a T x T outer product to the gradient at every step;
    the adjoint below runs the same vector recursion backwards (in cache blocks, like the
    kernels) and forms the gradient in one GEMM: d mat = sum_t v_{t-1}^T lambda_t.
    """
    return _forward(v0, mat, keep, steps)


def _forward(v0, mat, keep, steps):
    def block(m, v):
        return metrics.row_powers(v, m, steps, keep)

    return metrics.map_blocks(block, mat, v0)


def _rows_fwd(v0, mat, keep, steps):
    out = _forward(v0, mat, keep, steps)
    return out, (v0, mat, keep, out)


def _rows_bwd(steps, residuals, g):
    v0, mat, keep, out = residuals
    previous = jnp.concatenate([v0[..., None, :], out[..., :-1, :]], axis=-2)  # v_0..v_{K-1}

    def block(m, g_block, prev_block):
        hp = lax.Precision.HIGHEST

        def back(lam_next, g_t):  # lambda_t = g_t + (lambda_{t+1} * keep) m^T
            lam = g_t + jnp.einsum("bj,bij->bi", lam_next * keep, m, precision=hp)
            return lam, lam

        zero = jnp.zeros_like(g_block[:, 0])
        _, lam = lax.scan(back, zero, jnp.moveaxis(g_block, 1, 0), reverse=True)
        lam = jnp.moveaxis(lam, 0, 1) * keep  # b x K x T
        return jnp.einsum("bki,bkj->bij", prev_block, lam, precision=hp)

    d_mat = metrics.map_blocks(block, mat, g, previous)
    return jnp.zeros_like(v0), d_mat, jnp.zeros_like(keep)


rows.defvjp(_rows_fwd, _rows_bwd)
