"""Do the metrics find the heads a real language model needs? Michel et al.'s experiment
("Are Sixteen Heads Really Better than One?", 2019) on corpus windows, with the paper's
metric as one more order.

Heads are removed through the true head mask (each head's output scaled before the
output projection) in each order of `pruning.ORDERS`, and the next-token loss and
accuracy on the windows are measured at evenly spaced points from all heads to one head
per layer. Orders: projection norm, gradient importance E|dL/d mask|, greedy least loss
of minimax fidelity (layer by layer, so only one layer's attention is alive), random.
"""

from __future__ import annotations

import numpy as np

from beyondpar import pretrained, pruning, tasks


def next_token_examples(tokens_BxT) -> tasks.Examples:
    """Windows as examples of next-token prediction: the model reads every token but the
    last, and each position's target is the token after it."""
    tokens = np.asarray(tokens_BxT)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    return tasks.Examples(inputs, targets, np.ones(inputs.shape, bool))


def fidelity_sequences(module, params, tokens, imp, horizon: int) -> list[list]:
    """Each layer's greedy fidelity sequence, one layer's attention at a time."""
    per_layer = []
    run = pretrained.layer_by_layer(module, params, tokens)
    for layer in range(module.config.num_layers):
        _, attn = next(run)
        seq = pruning.greedy_sequences(attn[:, None], imp[layer][None], horizon)[0]
        per_layer.append([(loss, layer, head) for loss, _, head in seq])
    return per_layer


def orders(module, params, tokens, horizon: int, seed: int) -> dict:
    imp = np.asarray(pretrained.head_importances(module, params))
    return pruning.orders(
        imp,
        pruning.gradient_importance(module, params, next_token_examples(tokens)),
        fidelity_sequences(module, params, tokens, imp, horizon),
        seed,
    )


def corpus_curves(module, params, windows, cspec, spec) -> dict:
    """{order: {"order", "heads_pruned", "loss", "perplexity", "accuracy", "loss_auc",
    "accuracy_auc"}} on the first `cspec.pruning_windows` windows, at
    `cspec.pruning_points` evenly spaced points of each order."""
    cfg = module.config
    tokens = np.asarray(windows.tokens[: cspec.pruning_windows])
    examples = next_token_examples(tokens)
    out = {"windows": int(tokens.shape[0])}
    for name, order in orders(module, params, tokens, spec.horizon, cspec.seed).items():
        masks = pruning.masks_along(order, cfg.num_layers, cfg.num_heads)
        points = np.unique(np.linspace(0, len(masks) - 1, cspec.pruning_points).round().astype(int))
        loss, accuracy = pruning.masked_scores(module, params, examples, masks[points])
        out[name] = {
            "order": [list(p) for p in order],
            "heads_pruned": points.tolist(),
            "loss": loss.tolist(),
            "perplexity": np.exp(loss).tolist(),
            "accuracy": accuracy.tolist(),
            "loss_auc": pruning.area(loss, points, len(masks) - 1),
            "accuracy_auc": pruning.area(accuracy, points, len(masks) - 1),
        }
    return out
