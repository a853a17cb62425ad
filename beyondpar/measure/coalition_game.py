"""A layer's heads as a cooperative game: from the value of every coalition (B, 2^H), or
from sampled Shapley values, the record's COALITION fields of one objective; and the
fidelity game itself, the minimax fidelity of each coalition's mix.

Few heads: every coalition is valued (2^H mixes) and the Shapley values, the pairwise
interaction and the Harsanyi dividends of pairs and triples are exact. More heads than
`exact_heads`: Shapley values from sampled permutations, with standard errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from beyondpar import coalitions
from beyondpar.measure import record


def game_fields(values_BxC, objective: str) -> dict:
    """The COALITION fields of `objective` from every coalition's value (bit h = head h):
    Shapley values, pairwise interaction, pair and triple dividends (pairs when H >= 2,
    triples when H >= 3) and the share of them that is negative."""
    # float32 unless x64 is on, as the kernels compute (values may come as float64).
    values = jnp.asarray(values_BxC)
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


# The per-layer summary every report reads, one objective at a time: keys below, each
# an interval {"mean", "low", "high"} over sequences (or windows); a strongest dividend
# also names its `heads` (0-based). Entries a game lacks (sampled: no dividends) are absent.
STRONGEST = {
    "strongest_positive_pair": ("pair_dividends", 2, np.argmax),
    "strongest_negative_pair": ("pair_dividends", 2, np.argmin),
    "strongest_positive_triple": ("triple_dividends", 3, np.argmax),
    "strongest_negative_triple": ("triple_dividends", 3, np.argmin),
}
SHARES = ("negative_pair_share", "negative_triple_share")


def summarize(fields: dict, objective: str, intervals) -> dict:
    """One layer's summary of one objective from its COALITION fields over sequences
    (W, ...): the Shapley values (H intervals), their mean standard error, the mean
    pairwise interaction (H x H), the strongest positive and negative pair and triple
    dividends (largest and smallest mean) and the share of negative dividends.
    `intervals({key: W or W x K values}) -> {key: {"mean", "low", "high"}}` is the
    workflow's interval over sequences (one call per layer and objective)."""
    name = lambda n: record.coalition_field(n, objective)
    wanted = ("shapley", "pair_dividends", "triple_dividends", *SHARES)
    blocks = {n: np.asarray(fields[name(n)], np.float64) for n in wanted if name(n) in fields}
    stat = intervals(blocks)
    out = {"shapley": stat["shapley"]}
    out["shapley_stderr"] = np.asarray(fields[name("shapley_stderr")]).mean(0).tolist()
    if name("interaction") in fields:
        out["interaction"] = np.asarray(fields[name("interaction")]).mean(0).tolist()
    num_heads = blocks["shapley"].shape[-1]
    for key, (source, size, pick) in STRONGEST.items():
        if source in stat:
            index = int(pick(stat[source]["mean"]))
            chosen = {k: float(v[index]) for k, v in stat[source].items()}
            out[key] = {"heads": list(record.coalition_members(num_heads, size)[index]), **chosen}
    out.update({key: stat[key] for key in SHARES if key in stat})
    return out


def normal_intervals(blocks: dict) -> dict:
    """Mean and 95% normal interval (mean +- 1.96 standard errors) over axis 0 of each
    block; one sequence: low = high = mean."""
    out = {}
    for key, values in blocks.items():
        x = np.asarray(values, np.float64)
        mean = x.mean(0)
        half = 1.96 * x.std(0, ddof=1) / np.sqrt(len(x)) if len(x) > 1 else np.zeros_like(mean)
        out[key] = {
            "mean": mean.tolist(),
            "low": (mean - half).tolist(),
            "high": (mean + half).tolist(),
        }
    return out
