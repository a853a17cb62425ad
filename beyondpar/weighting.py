"""The head weights that serve the sink best: `optimal_weights`.

Minimax fidelity is a min over tokens of a max over steps, so it is not smooth in the
weights. The search runs Adam on a smooth surrogate (weights = softmax of logits; max
over steps and min over tokens replaced by temperature-scaled log-sum-exp, the
temperature annealed towards the exact metric) from several starts at once, then scores
every start and every result with the exact kernels and keeps the best. The result is
therefore never worse than any start, in particular never worse than the best single head.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from beyondpar import _checks, graphs, metrics

OBJECTIVES = ("fidelity", "hitting_time")
_FLOOR = 1e-6  # the smallest weight a start of the search gives a head


def optimal_weights(
    attn,
    objective: str = "fidelity",
    walk: str = "reference",
    horizon: int = 100,
    max_steps: int = 100,
    init=None,
    steps: int = 80,
    learning_rate: float = 0.1,
):
    """(weights (H,), value): the head mix maximising the mean minimax fidelity, or
    minimising the mean hitting time, of the mixed operators of the N attention sets in
    `attn` (N x H x T x T, or H x T x T for one set).

    Extra leading axes (e.g. L x N x H x T x T for every layer of a model) are independent
    problems solved in one batch: weights (..., H) and values (...). Candidates scored
    exactly: uniform, `init` (e.g. the learned importances, shape (..., H)) when given,
    every single head, and the results of the descent from uniform, `init` and the best
    single head.
    """
    objective = _checks.one_of("objective", objective, OBJECTIVES)
    walk = _checks.one_of("walk", walk, metrics.WALKS)
    horizon = _checks.positive_int("horizon", horizon)
    max_steps = _checks.positive_int("max_steps", max_steps)
    steps = _checks.positive_int("steps", steps)
    a = _checks.as_float_array("attn", attn)
    if a.ndim < 3:
        raise ValueError(f"attn must have shape (N, H, T, T) or (H, T, T), got shape {a.shape}")
    if a.ndim == 3:
        a = a[None]
    a = metrics.check_operator(a, "attn")
    settings = dict(objective=objective, walk=walk, horizon=horizon, max_steps=max_steps)
    base = _base_candidates(a.shape[-3], init, a.shape[:-4], a.dtype)  # ... x S x H
    base_scores = _exact_scores(a, base, **settings)
    starts = _descent_starts(base, base_scores, objective, has_init=init is not None)
    found = _descend(a, starts, steps=steps, learning_rate=learning_rate, **settings)
    candidates = jnp.concatenate([base, found], axis=-2)
    scores = jnp.concatenate([base_scores, _exact_scores(a, found, **settings)], axis=-1)
    best = jnp.argmax(scores if objective == "fidelity" else -scores, axis=-1)
    weights = jnp.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]
    value = jnp.take_along_axis(scores, best[..., None], axis=-1)[..., 0]
    return weights, value


def _base_candidates(num_heads: int, init, lead: tuple, dtype) -> jax.Array:
    """Uniform, then the learned weights when given, then every single head."""
    rows = jnp.asarray(np.vstack([np.full(num_heads, 1.0 / num_heads), np.eye(num_heads)]), dtype)
    rows = jnp.broadcast_to(rows, (*lead, num_heads + 1, num_heads))
    if init is None:
        return rows
    learned = graphs.normalize_weights(init, num_heads).astype(dtype)
    learned = jnp.broadcast_to(learned, (*lead, num_heads))[..., None, :]
    return jnp.concatenate([rows[..., :1, :], learned, rows[..., 1:, :]], axis=-2)


def _descent_starts(base, scores, objective: str, has_init: bool, heads_kept: int = 1):
    """Uniform, learned, and the best `heads_kept` single heads: the descent from every
    head would cost H times more, and every head is scored exactly anyway."""
    fixed = 2 if has_init else 1
    single = scores[..., fixed:] if objective == "fidelity" else -scores[..., fixed:]
    top = jnp.argsort(-single, axis=-1)[..., : min(heads_kept, single.shape[-1])]
    heads = jnp.take_along_axis(base[..., fixed:, :], top[..., None], axis=-2)
    return jnp.concatenate([base[..., :fixed, :], heads], axis=-2)


def _exact_scores(attn, candidates, *, objective, walk, horizon, max_steps):
    """Exact objective of every candidate mix: one batched kernel call, mean over N."""
    mixed = jnp.einsum("...sh,...nhij->...snij", candidates, attn)
    if objective == "fidelity":
        values = metrics.minimax_fidelity(mixed, horizon)
    else:
        values = metrics.hitting_time(mixed, max_steps, walk)
    return jnp.mean(values, axis=-1)


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
