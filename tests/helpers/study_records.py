"""Evaluation records as the study writes them, small and made up, for the report and
page tests; `with_view` adds the packed attention of a random causal sequence."""

from __future__ import annotations

import numpy as np

from beyondpar.study import attention_view


def stat(values):
    return {"mean": values, "std": [0.0] * len(values)}


def record(run, heads, seed, fid):
    return {
        "run": run,
        "step": 8,
        "task": "copy",
        "heads": heads,
        "seed": seed,
        "layers": 2,
        "metrics": {
            "fidelity": stat([fid, fid + 0.1]),
            "hitting_time": stat([5.0, 6.0]),
            "fidelity_uniform": stat([fid / 2, fid / 3]),
            "fidelity_per_head": stat([[fid - 0.01 * h for h in range(heads)]] * 2),
            "hitting_time_per_head": stat([[7.0 + h for h in range(heads)]] * 2),
        },
    }


def causal(seed, layers, heads, t):
    """Random causal attention (L, H, T, T): each row a softmax over the keys it may read."""
    logits = np.random.default_rng(seed).normal(size=(layers, heads, t, t))
    logits[..., ~np.tril(np.ones((t, t), bool))] = -np.inf
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def with_view(r, seed):
    """A record carrying the packed attention of a sequence of 6 tokens."""
    attn = causal(seed, r["layers"], r["heads"], 6)
    weights = np.full((r["layers"], r["heads"]), 1.0)
    view = attention_view.sequence_view(attn, np.arange(6), {"learned": weights}, 10)
    return {**r, attention_view.KEY: view}, attn
