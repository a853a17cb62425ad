"""A layer's heads as a cooperative game: from the value of every coalition (B, 2^H), or
from sampled Shapley values, the record's COALITION fields of one objective; and the
fidelity game itself, the minimax fidelity of each coalition's mix.

Few heads: every coalition is valued (2^H mixes) and the Shapley values, the pairwise
interaction and the Harsanyi dividends of pairs and triples are exact. More heads than
`exact_heads`: Shapley values from sampled permutations, with standard errors."""

from __future__ import annotations

import numpy as np

from beyondpar import coalitions
from beyondpar.measure import record


def game_fields(values_BxC, objective: str) -> dict:
    """The COALITION fields of `objective` from every coalition's value (bit h = head h):
    Shapley values, pairwise interaction, pair and triple dividends (pairs when H >= 2,
    triples when H >= 3) and the share of them that is negative."""
    values = np.asarray(values_BxC, np.float64)
    num_heads = int(values.shape[-1]).bit_length() - 1
    name = lambda n: record.coalition_field(n, objective)
    shapley = np.asarray(coalitions.shapley(values))
    out = {
        name("shapley"): shapley,
        name("shapley_stderr"): np.zeros_like(shapley),
        name("interaction"): np.asarray(coalitions.interaction(values)),
    }
    dividends = np.asarray(coalitions.harsanyi(values))
    for size, label in ((2, "pair"), (3, "triple")):
        members = record.coalition_members(num_heads, size)
        if not members:
            continue
        index = [sum(1 << h for h in heads) for heads in members]
        chosen = dividends[:, index]
        out[name(f"{label}_dividends")] = chosen
        out[name(f"negative_{label}_share")] = np.mean(chosen < 0, axis=-1)
    return out


def sampled_fields(mean_BxH, stderr_BxH, objective: str) -> dict:
    """The COALITION fields a sampled game has: Shapley values and their standard errors."""
    return {
        record.coalition_field("shapley", objective): np.asarray(mean_BxH, np.float64),
        record.coalition_field("shapley_stderr", objective): np.asarray(stderr_BxH, np.float64),
    }


def fidelity_fields(
    attn_BxHxTxT, weights, horizon: int, exact_heads: int, permutations: int, key
) -> dict:
    """The fidelity game's COALITION fields for one layer, each coalition's mix weighted
    by `weights` (H,) or per sequence (B, H) renormalised over its members (None:
    uniform). Exact up to `exact_heads` heads, else sampled."""
    h = attn_BxHxTxT.shape[1]
    if h > exact_heads:
        value_fn = coalitions.mix_value_fn(attn_BxHxTxT, weights, "fidelity", horizon)
        mean, stderr = coalitions.sampled_shapley(value_fn, h, permutations, key)
        return sampled_fields(mean, stderr, "fidelity")
    values = coalitions.values(attn_BxHxTxT, weights, objective="fidelity", horizon=horizon)
    return game_fields(values, "fidelity")
