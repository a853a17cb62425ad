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

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from beyondpar import graphs, pretrained, pruning


def window_losses(module, params, tokens_BxT, head_mask):
    """(B,) mean next-token cross-entropy and (B,) top-1 accuracy of each window."""
    logits = module.apply({"params": params}, tokens_BxT, head_mask=head_mask)
    logits, targets = logits[:, :-1].astype(jnp.float32), tokens_BxT[:, 1:]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    accuracy = jnp.argmax(logits, -1) == targets
    return jnp.mean(loss, -1), jnp.mean(accuracy, -1)


@functools.partial(jax.jit, static_argnums=0)
def _gradient(module, params, tokens):
    cfg = module.config
    ones = jnp.ones((tokens.shape[0], cfg.num_layers, cfg.num_heads), jnp.float32)
    total = lambda m: jnp.sum(window_losses(module, params, tokens, m)[0])
    return jnp.mean(jnp.abs(jax.grad(total)(ones)), axis=0)


@functools.partial(jax.jit, static_argnums=0)
def _masked(module, params, tokens, masks):
    """Mean loss and accuracy over the windows under each mask (P, L, H), one at a time."""

    def one(mask):
        loss, accuracy = window_losses(module, params, tokens, mask)
        return jnp.mean(loss), jnp.mean(accuracy)

    return jax.lax.map(one, masks)


def importances(module, params) -> np.ndarray:
    """(L, H) Frobenius norm of each head's block of its layer's output projection."""
    fam = pretrained.family(module)
    cfg = module.config
    return np.stack(
        [
            np.asarray(
                graphs.head_importance(fam.out_kernel(params, i).astype(jnp.float32), cfg.num_heads)
            )
            for i in range(cfg.num_layers)
        ]
    )


def fidelity_order(module, params, tokens, imp, horizon: int) -> list[tuple[int, int]]:
    """The greedy fidelity order, one layer's attention at a time."""
    per_layer = []
    run = pretrained.layer_by_layer(module, params, tokens)
    for layer in range(module.config.num_layers):
        _, attn = next(run)
        seq = pruning.greedy_sequences(attn[:, None], imp[layer][None], horizon)[0]
        per_layer.append([(loss, layer, head) for loss, _, head in seq])
    return pruning.merge_sequences(per_layer)


def orders(module, params, tokens, horizon: int, seed: int) -> dict:
    cfg = module.config
    imp = importances(module, params)
    rng = np.random.default_rng(seed)
    return {
        "projection": pruning.order_from_scores(imp),
        "gradient": pruning.order_from_scores(_gradient(module, params, jnp.asarray(tokens))),
        "fidelity": fidelity_order(module, params, tokens, imp, horizon),
        "random": pruning.order_from_scores(rng.random((cfg.num_layers, cfg.num_heads))),
    }


def corpus_curves(module, params, windows, cspec, spec) -> dict:
    """{order: {"order", "heads_pruned", "loss", "perplexity", "accuracy", "loss_auc",
    "accuracy_auc"}} on the first `cspec.pruning_windows` windows, at
    `cspec.pruning_points` evenly spaced points of each order."""
    cfg = module.config
    tokens = jnp.asarray(windows.tokens[: cspec.pruning_windows])
    out = {"windows": int(tokens.shape[0])}
    for name, order in orders(module, params, tokens, spec.horizon, cspec.seed).items():
        masks = pruning.masks_along(order, cfg.num_layers, cfg.num_heads)
        points = np.unique(np.linspace(0, len(masks) - 1, cspec.pruning_points).round().astype(int))
        loss, accuracy = (np.asarray(v) for v in _masked(module, params, tokens, masks[points]))
        fraction = points / max(len(masks) - 1, 1)
        out[name] = {
            "order": [list(p) for p in order],
            "heads_pruned": points.tolist(),
            "loss": loss.tolist(),
            "perplexity": np.exp(loss).tolist(),
            "accuracy": accuracy.tolist(),
            "loss_auc": float(np.trapezoid(loss, fraction)),
            "accuracy_auc": float(np.trapezoid(accuracy, fraction)),
        }
    return out
