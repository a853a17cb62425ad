"""Which heads to remove first, from scores and attention alone (no model is run here):
orders from per-head scores, the greedy fidelity order, the head masks along an order
and the area under a pruning curve.

Orders (least important first, all heads of the model ranked together):
- `projection`: Frobenius norm of each head's block of the output projection (the paper's);
- `gradient`: I_h = E_x |dL/d mask_h| at mask = 1 (Michel et al. 2019, "Are Sixteen Heads
  Really Better than One?"; the scores come from `head_masking.gradient_importance`);
- `fidelity`: greedy, the head whose removal costs its layer's minimax fidelity least.
- `random`: a seeded random order, the baseline any score must beat.
Projection and gradient scores are divided by their layer's L2 norm, as Michel et al. do,
so that layers compete on equal terms. A layer always keeps one head.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics
from beyondpar.base import checks, parallel

ORDERS = ("projection", "gradient", "fidelity", "random")


def order_from_scores(scores_LxH) -> list[tuple[int, int]]:
    """(layer, head) pairs, least important first, scores normalised per layer (L2),
    the most important head of each layer never listed (a layer keeps one head)."""
    scores = np.asarray(scores_LxH, np.float64)
    norms = np.linalg.norm(scores, axis=-1, keepdims=True)
    scaled = scores / np.where(norms > 0, norms, 1)
    keep = set(enumerate(np.argmax(scaled, axis=-1).tolist()))
    ranked = sorted(np.ndindex(scores.shape), key=lambda index: scaled[index])
    return [(int(layer), int(head)) for layer, head in ranked if (layer, head) not in keep]


def orders(importances_LxH, gradient_LxH, fidelity_sequences, seed: int = 0) -> dict:
    """Every order of ORDERS as (layer, head) lists, least important first, from the
    projection norms, the mask gradients and each layer's greedy fidelity sequence."""
    rng = np.random.default_rng(seed)
    return {
        "projection": order_from_scores(importances_LxH),
        "gradient": order_from_scores(gradient_LxH),
        "fidelity": merge_sequences(fidelity_sequences),
        "random": order_from_scores(rng.random(np.shape(importances_LxH))),
    }


def fidelity_order(attn, importances, horizon: int = 100):
    """Greedy global order over attention `attn` (N, L, H, T, T) with learned head weights
    `importances` (L, H): at each step the head whose removal lowers its layer's mean
    minimax fidelity least (mix of the remaining heads, learned weights renormalised).

    Layers are independent here, so each layer's greedy sequence is found in H - 1 batched
    rounds over all layers at once and the sequences are merged by their losses.
    """
    return merge_sequences(greedy_sequences(attn, importances, horizon))


def greedy_sequences(attn, importances, horizon: int = 100) -> list[list]:
    """Per layer of attention `attn` (N, L, H, T, T) with head weights `importances` (L, H):
    [(fidelity lost, layer, head), ...] in greedy removal order."""
    horizon = checks.positive_int("horizon", horizon)
    # Checked once: every candidate below is a convex mix of these rows.
    attn = metrics.check_operator(attn, "attn")
    causal = metrics.is_causal(attn)  # and so is every mix: not checked again each round
    num_layers, num_heads = attn.shape[1], attn.shape[2]
    attn = _layers_first(attn)
    imp = np.asarray(importances, np.float64)
    alive = np.ones((num_layers, num_heads), bool)
    current = _mixed_fidelity(attn, imp[:, None, :], horizon, causal)[:, 0]
    per_layer = [[] for _ in range(num_layers)]
    for _ in range(num_heads - 1):
        # Every layer has the same number of heads left: candidates are L x left.
        left = np.stack([np.flatnonzero(row) for row in alive])
        remaining = np.repeat(alive[:, None, :], left.shape[1], axis=1)
        np.put_along_axis(remaining, left[..., None], False, axis=-1)
        weights = imp[:, None, :] * remaining
        weights = np.where(weights.sum(-1, keepdims=True) > 0, weights, remaining)
        fid = _mixed_fidelity(attn, weights, horizon, causal)
        pick = np.argmax(fid, axis=-1)
        for layer, (i, head) in enumerate(
            zip(pick, left[np.arange(num_layers), pick], strict=True)
        ):
            per_layer[layer].append((current[layer] - fid[layer, i], layer, int(head)))
            alive[layer, head] = False
        current = fid[np.arange(num_layers), pick]
    return per_layer


def _layers_first(attn_NxLxHxTxT):
    """The attention as L x H x N x T x T, the layers split over the devices when they
    divide: every round's mixes are then one product per layer, made and scored on the
    layer's device (no transposed copy of the mixes, nothing moved between devices)."""
    return parallel.split_first_axis(jnp.transpose(attn_NxLxHxTxT, (1, 2, 0, 3, 4)))


def _mixed_fidelity(attn_LxHxNxTxT, weights_LxCxH, horizon, causal=None):
    """Mean over sequences of the minimax fidelity of each candidate mix: L x C.
    `causal`: whether the attention is lower triangular (None: checked)."""
    a = attn_LxHxNxTxT
    w = graphs.normalize_weights(np.asarray(weights_LxCxH, a.dtype), a.shape[1])
    mixed = jnp.einsum("lch,lhnij->lcnij", w, a)
    fidelity = metrics.objective_unchecked(mixed, "fidelity", horizon, 1, "reference", causal)
    return np.asarray(jnp.mean(fidelity, axis=-1))


def merge_sequences(per_layer) -> list[tuple[int, int]]:
    """Global greedy: repeatedly the layer whose next removal loses least."""
    fronts = [0] * len(per_layer)
    order = []
    while any(f < len(seq) for f, seq in zip(fronts, per_layer, strict=True)):
        layer = min(
            (i for i, seq in enumerate(per_layer) if fronts[i] < len(seq)),
            key=lambda i: per_layer[i][fronts[i]][0],
        )
        order.append(per_layer[layer][fronts[layer]][1:])
        fronts[layer] += 1
    return order


def masks_along(order, num_layers: int, num_heads: int) -> np.ndarray:
    """(len(order) + 1, L, H): all heads, then one more head removed at each point."""
    masks = np.ones((len(order) + 1, num_layers, num_heads), np.float32)
    for k, (layer, head) in enumerate(order, start=1):
        masks[k:, layer, head] = 0.0
    return masks


def area(values_P, heads_pruned_P, total_pruned: int) -> float:
    """Area under a pruning curve against the share of prunable heads removed (0..1)."""
    share = np.asarray(heads_pruned_P, np.float64) / max(total_pruned, 1)
    return float(np.trapezoid(np.asarray(values_P), share))
