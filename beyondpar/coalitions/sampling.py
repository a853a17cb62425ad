"""Shapley values by permutation sampling, for more heads than every coalition allows
(or fewer evaluations than 2^H): each random order of the heads adds them one at a time,
and head h's marginal contribution v(before h + h) - v(before h) averages, over orders,
to its Shapley value. Orders are independent, so the standard error is the marginals'
standard deviation over orders / sqrt(orders). The coalitions that several orders share
(always the empty and the full one) are evaluated once."""

from __future__ import annotations

import jax
import numpy as np
import tqdm

from beyondpar.base import checks
from beyondpar.coalitions import game, mix_game


def orders(key, num_heads: int, permutations: int) -> np.ndarray:
    """(P, H) int: P random orders of the heads from `key`."""
    keys = jax.random.split(key, permutations)
    return np.asarray(jax.vmap(lambda k: jax.random.permutation(k, num_heads))(keys))


def sampled_shapley(
    value_fn: mix_game.ValueFn,
    num_heads: int,
    permutations: int,
    key,
    progress: bool = False,
    antithetic: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(mean (B, H), stderr (B, H)): Shapley values of the game `value_fn` (a (K, H) 0/1
    mask batch -> (B, K) values, e.g. `mix_value_fn`) estimated from `permutations`
    random orders of the `num_heads` heads drawn from the `jax.random` key `key`; stderr is
    0 with a single order. Evaluates at most permutations (H - 1) + 2 coalitions.

    `antithetic`: the second half of the orders are the first half reversed (an even
    `permutations`), a head early in one late in the other, and the standard error is
    over the pairs: for the same evaluations, usually a smaller error."""
    h = checks.positive_int("num_heads", num_heads)
    p = checks.positive_int("permutations", permutations)
    if antithetic and p % 2:
        raise ValueError(f"permutations must be even with antithetic=True, got {p}")
    order = orders(key, h, p // 2 if antithetic else p)
    if antithetic:
        order = np.concatenate([order, order[:, ::-1]])
    position = np.empty_like(order)
    position[np.arange(p)[:, None], order] = np.arange(h)
    # Prefix k of each order (k = 0..H): the heads at positions before k.
    prefixes = position[:, None, :] < np.arange(h + 1)[None, :, None]  # P x (H+1) x H
    unique, inverse = np.unique(prefixes.reshape(-1, h), axis=0, return_inverse=True)
    table = _evaluate(value_fn, unique.astype(np.float32), progress)
    v = table[:, inverse.reshape(-1)].reshape(table.shape[0], p, h + 1)
    steps = np.diff(v.astype(np.float64), axis=-1)  # B x P x H: step k adds order[:, k]
    marginals = np.empty_like(steps)
    marginals[:, np.arange(p)[:, None], order] = steps
    if antithetic:  # each pair's mean is one independent draw
        marginals, p = (marginals[:, : p // 2] + marginals[:, p // 2 :]) / 2, p // 2
    mean = marginals.mean(1)
    stderr = marginals.std(1, ddof=1) / np.sqrt(p) if p > 1 else np.zeros_like(mean)
    return mean.astype(table.dtype), stderr.astype(table.dtype)


def _evaluate(value_fn, masks_KxH: np.ndarray, progress: bool) -> np.ndarray:
    """(B, K): `value_fn` on the masks, in chunks with a progress bar when `progress`."""
    parts = []
    chunk = mix_game.PROGRESS_CHUNK
    with tqdm.tqdm(
        total=len(masks_KxH), desc="coalitions", unit="coalition", disable=not progress
    ) as bar:
        for start in range(0, len(masks_KxH), chunk):
            parts.append(np.asarray(value_fn(masks_KxH[start : start + chunk])))
            bar.update(len(parts[-1][0]))
    return np.concatenate(parts, axis=-1)


def shapley_values(
    attn_BxHxTxT=None,
    weights_H=None,
    objective: str = "fidelity",
    horizon: int | None = None,
    walk: str = mix_game.WALK,
    samples: int | None = None,
    key=None,
    value_fn: mix_game.ValueFn | None = None,
    num_heads: int | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(Shapley values (B, H), standard errors (B, H)) of the heads in the game of
    `values` (same arguments): exact over every coalition (standard errors 0) up to 16
    heads when `samples` is None, else from `samples` random orders drawn from `key`
    (default PRNGKey(0))."""
    if value_fn is None:
        if attn_BxHxTxT is None:
            raise ValueError("shapley_values needs attn_BxHxTxT or value_fn, got neither")
        value_fn = mix_game.mix_value_fn(attn_BxHxTxT, weights_H, objective, horizon, walk)
    h = num_heads if num_heads is not None else getattr(value_fn, "num_heads", None)
    if h is None:
        raise ValueError("shapley_values with a value_fn needs num_heads, got None")
    if samples is None and h > mix_game.MAX_EXACT_HEADS:
        raise ValueError(
            f"samples must be given for more than {mix_game.MAX_EXACT_HEADS} heads, got {h} heads"
        )
    if samples is None:
        table = mix_game.values(value_fn=value_fn, num_heads=h, progress=progress)
        phi = np.asarray(game.shapley(table))
        return phi, np.zeros_like(phi)
    key = jax.random.PRNGKey(0) if key is None else key
    return sampled_shapley(value_fn, h, samples, key, progress)
