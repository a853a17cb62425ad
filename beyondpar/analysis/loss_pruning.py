"""Do the metrics find the heads a real language model needs? Michel et al.'s experiment
("Are Sixteen Heads Really Better than One?", 2019) on corpus windows, with the paper's
metric as one more order.

Heads are removed through the true head mask (each head's output scaled before the
output projection) in each order of `pruning.ORDERS`, and the next-token loss and
accuracy on the windows are measured at evenly spaced points from all heads to one head
per layer. Orders: projection norm, gradient importance E|dL/d mask|, greedy least loss
of minimax fidelity (layer by layer, so only one layer's attention is alive), random.

Cost, in forward passes over the pruning windows: one forward and backward pass for the
gradient, one pass for the attention the greedy order reads, then one masked pass per
point: every order starts from all heads (measured once), so 1 + 4 (P - 1) passes for P
points per order (41 for the default 11).
"""

from __future__ import annotations

import numpy as np
import tqdm

from beyondpar import batches, pretrained, pruning


def next_token_batch(tokens_BxT) -> batches.Batch:
    """Windows as a batch of next-token prediction: the model reads every token but the
    last, and each position's target is the token after it."""
    tokens = np.asarray(tokens_BxT)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    return batches.Batch(inputs, targets, np.ones(inputs.shape, bool))


def fidelity_sequences(module, params, tokens, imp, horizon: int, bar=None) -> list[list]:
    """Each layer's greedy fidelity sequence, one layer's attention at a time."""
    per_layer = []
    run = pretrained.layer_by_layer(module, params, tokens)
    for layer in range(module.config.num_layers):
        _, attn = next(run)
        seq = pruning.greedy_sequences(attn[:, None], imp[layer][None], horizon)[0]
        per_layer.append([(loss, layer, head) for loss, _, head in seq])
        if bar is not None:
            bar.update(1)
    return per_layer


def orders(module, params, tokens, horizon: int, seed: int, progress: bool = False) -> dict:
    """The four orders; a bar counts the gradient pass and each layer's greedy order."""
    total = 1 + module.config.num_layers
    with tqdm.tqdm(total=total, desc="pruning: orders", unit="step", disable=not progress) as bar:
        imp = np.asarray(pretrained.head_importances(module, params))
        gradient = pruning.gradient_importance(module, params, next_token_batch(tokens))
        bar.update(1)
        sequences = fidelity_sequences(module, params, tokens, imp, horizon, bar)
    return pruning.orders(imp, gradient, sequences, seed)


def corpus_curves(module, params, windows, cspec, spec, progress: bool = True) -> dict:
    """{order: {"order", "heads_pruned", "loss", "perplexity", "accuracy", "loss_auc",
    "accuracy_auc"}} on the first `cspec.pruning_windows` windows, at
    `cspec.pruning_points` evenly spaced points of each order."""
    cfg = module.config
    tokens = np.asarray(windows.tokens[: cspec.pruning_windows])
    batch = next_token_batch(tokens)
    found = orders(module, params, tokens, spec.horizon, cspec.seed, progress)
    masks = {}
    for name, order in found.items():
        along = pruning.masks_along(order, cfg.num_layers, cfg.num_heads)
        points = np.unique(np.linspace(0, len(along) - 1, cspec.pruning_points).round())
        masks[name] = (points.astype(int), along[points.astype(int)], len(along) - 1)
    scores = _scores(module, params, batch, masks, progress)
    out = {"windows": int(tokens.shape[0])}
    for name, (points, _, total) in masks.items():
        loss, accuracy = scores[name]
        out[name] = {
            "order": [list(p) for p in found[name]],
            "heads_pruned": points.tolist(),
            "loss": loss.tolist(),
            "perplexity": np.exp(loss).tolist(),
            "accuracy": accuracy.tolist(),
            "loss_auc": pruning.area(loss, points, total),
            "accuracy_auc": pruning.area(accuracy, points, total),
        }
    return out


def _scores(module, params, batch, masks: dict, progress: bool) -> dict:
    """{order: (loss (P,), accuracy (P,))}, one masked pass per point, the shared
    all-heads point once."""
    total = 1 + sum(len(points) - 1 for points, _, _ in masks.values())
    bar = tqdm.tqdm(total=total, desc="pruning: masked passes", unit="pass", disable=not progress)
    with bar:
        full = masks[next(iter(masks))][1][:1]  # no head removed: the same for every order
        first = pruning.masked_scores(module, params, batch, full)
        bar.update(1)
        out = {}
        for name, (_, order_masks, _) in masks.items():
            scores = [first]
            for mask in order_masks[1:]:
                scores.append(pruning.masked_scores(module, params, batch, mask[None]))
                bar.update(1)
            out[name] = tuple(np.concatenate(parts) for parts in zip(*scores, strict=True))
    return out
