"""Cooperative-game transforms of coalition values: Harsanyi dividends (the Moebius
transform) and back (the zeta transform), Shapley values and the pairwise Shapley
interaction index.

A game on H players is an array `values_...xC`, C = 2^H, indexed by bitmask: coalition c
holds head h when bit h of c is set (c = 0 is the empty coalition, c = 2^H - 1 all heads).
The transforms are fast subset sums, O(H 2^H) per game, never the O(3^H) double sum.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar.base import checks

MAX_HEADS = 30  # 2^30 coalitions: far past memory; a guard against a wrong axis


def coalition_masks(num_heads: int) -> np.ndarray:
    """(2^H, H) 0/1 float32: row c is coalition c, entry h is bit h of c."""
    h = checks.positive_int("num_heads", num_heads)
    if h > MAX_HEADS:
        raise ValueError(f"num_heads must be at most {MAX_HEADS}, got {h}")
    c = np.arange(2**h)
    return ((c[:, None] >> np.arange(h)) & 1).astype(np.float32)


def coalition_sizes(num_heads: int) -> np.ndarray:
    """(2^H,) int: the number of heads of each coalition (the popcount of its index)."""
    return coalition_masks(num_heads).sum(-1).astype(np.int64)


def num_players(values, name: str = "values_BxC") -> tuple[jax.Array, int]:
    """(values as a float array, H) after checking the last axis is 2^H long (H >= 1)."""
    v = checks.as_float_array(name, values)
    c = v.shape[-1] if v.ndim else 0
    if v.ndim < 1 or c < 2 or c & (c - 1):
        raise ValueError(
            f"{name} must end in an axis of 2^H coalitions (H >= 1), got shape {v.shape}"
        )
    return v, c.bit_length() - 1


def harsanyi(values_BxC) -> jax.Array:
    """Harsanyi dividends d(S) = sum_{T subset S} (-1)^{|S|-|T|} v(T), shape as `values`.

    d({h}) = v({h}) - v({}); d({i, j}) is the pair's surplus over its members alone
    (v({i,j}) - v({i}) - v({j}) + v({})): positive where the pair amplifies. The values
    are the zeta transform (`zeta`) of the dividends."""
    v, h = num_players(values_BxC)
    return _butterfly(v, h, -1.0)


def zeta(dividends_BxC) -> jax.Array:
    """v(S) = sum_{T subset S} d(T): the inverse of `harsanyi`."""
    d, h = num_players(dividends_BxC, "dividends_BxC")
    return _butterfly(d, h, 1.0)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _butterfly(v, h: int, sign: float):
    """Subset sums over one bit at a time: the entries with bit k set gain (or lose) the
    entry without it, for k = 0..H-1: O(H 2^H)."""
    lead, c = v.shape[:-1], v.shape[-1]
    flat = v.reshape(-1, c)
    for k in range(h):
        x = flat.reshape(-1, c >> (k + 1), 2, 1 << k)
        flat = jnp.stack([x[:, :, 0], x[:, :, 1] + sign * x[:, :, 0]], axis=2).reshape(-1, c)
    return flat.reshape(*lead, c)


def shapley(values_BxC) -> jax.Array:
    """Shapley values (..., H): phi_h = sum_{S containing h} d(S) / |S|, each coalition's
    dividend shared equally among its members. They sum to v(all) - v({}) (efficiency);
    equal for heads that are interchangeable in the game; 0 for a head whose joining
    never changes the value (null player)."""
    v, h = num_players(values_BxC)
    return _shapley(v, h)


@functools.partial(jax.jit, static_argnums=1)
def _shapley(v, h: int):
    masks = jnp.asarray(coalition_masks(h), v.dtype)
    sizes = jnp.sum(masks, -1)
    share = _butterfly(v, h, -1.0) / jnp.maximum(sizes, 1)
    return share @ masks


def interaction(values_BxC) -> jax.Array:
    """The Shapley interaction index (Grabisch) of every pair of heads, (..., H, H):
    I_ij = sum_{S containing i and j} d(S) / (|S| - 1), symmetric; positive where heads i
    and j do more together than apart, averaged over the coalitions they may join. The
    diagonal holds the Shapley values, the index of the singletons (I_i = phi_i)."""
    v, h = num_players(values_BxC)
    return _interaction(v, h)


@functools.partial(jax.jit, static_argnums=1)
def _interaction(v, h: int):
    masks = jnp.asarray(coalition_masks(h), v.dtype)
    sizes = jnp.sum(masks, -1)
    d = _butterfly(v, h, -1.0)
    pair_share = jnp.where(sizes >= 2, d / jnp.maximum(sizes - 1, 1), 0)
    pairs = jnp.einsum("...c,ci,cj->...ij", pair_share, masks, masks)
    phi = (d / jnp.maximum(sizes, 1)) @ masks
    eye = jnp.eye(h, dtype=bool)
    return jnp.where(eye, phi[..., None, :] * eye, pairs)
