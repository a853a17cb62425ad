"""Pruning curves of the paper's model: heads removed in each order of `pruning.ORDERS`,
and at every point the accuracy of the masked model with the minimax fidelity and
hitting time of every layer's mix of the heads that remain (a true ablation)."""

from __future__ import annotations

import concurrent.futures
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics, pruning, tasks

MASK_CHUNK = 8  # masked forward passes per jitted call: bounds memory at T x T per head


@functools.partial(jax.jit, static_argnums=0)
def _masked_runs(module, params, examples: tasks.Examples, importances, masks):
    """Per mask: accuracy on predictable positions and every layer's mix of the remaining
    heads (learned weights times mask, renormalised), one mask at a time in memory."""

    def one(mask):
        logits, state = module.apply(
            {"params": params},
            examples.inputs,
            deterministic=True,
            head_mask=mask,
            mutable=["intermediates"],
        )
        correct = (jnp.argmax(logits, -1) == examples.targets) & examples.predictable
        accuracy = jnp.sum(correct) / jnp.maximum(jnp.sum(examples.predictable), 1)
        layers = state["intermediates"]
        mixed = [  # layer by layer: never every head of every layer at once
            graphs.combine_heads(
                layers[f"layers_{i}"]["attn"]["attention"][0].astype(jnp.float32),
                importances[i] * mask[i],
            )
            for i in range(module.config.num_layers)
        ]
        return accuracy, jnp.stack(mixed, axis=1)

    return jax.lax.map(one, masks)


def curve(module, params, examples, importances, masks, horizon, max_steps, walk) -> dict:
    """Accuracy (P,) and mean fidelity / hitting time per layer (P, L) along `masks`."""

    def chunk(masks_chunk):
        acc, mixed = _masked_runs(module, params, examples, importances, masks_chunk)
        # Only the minimax and the hitting time: the minimax stops once it is settled,
        # instead of riding the walk's full sweep (same values, bit for bit).
        fid = metrics.minimax_fidelity(mixed, horizon)
        hit = metrics.hitting_time(mixed, max_steps, walk, validate=False)
        fid, hit = jnp.mean(fid, axis=1), jnp.mean(hit, axis=1)
        return np.asarray(acc), np.asarray(fid), np.asarray(hit)

    chunks = [masks[s : s + MASK_CHUNK] for s in range(0, len(masks), MASK_CHUNK)]
    # Forward passes on one device leave cores idle; chunks from several threads run at once.
    with concurrent.futures.ThreadPoolExecutor(min(len(chunks), os.cpu_count() or 1)) as pool:
        accuracy, fidelity, hitting = zip(*pool.map(chunk, chunks), strict=True)
    accuracy = np.concatenate(accuracy)
    pruned = list(range(len(masks)))
    return {
        "heads_pruned": pruned,
        "accuracy": accuracy.tolist(),
        "fidelity": np.concatenate(fidelity).tolist(),
        "hitting_time": np.concatenate(hitting).tolist(),
        "auc": pruning.area(accuracy, pruned, len(masks) - 1),
    }


def pruning_curves(module, params, examples, importances, attn_NxLxHxTxT, spec) -> dict:
    """{order: {"order": [(layer, head)], "accuracy", "fidelity", "hitting_time", "auc"}}
    for every order, pruning from all heads to one head per layer. `spec` gives horizon,
    max_steps, walk and seed (an `evaluate.EvalSpec`)."""
    cfg = module.config
    params = jax.device_get(params)  # on the default device, with everything else here
    examples = tasks.Examples(*(np.asarray(a) for a in examples))
    importances = np.asarray(importances, np.float32)
    attn_NxLxHxTxT = np.asarray(attn_NxLxHxTxT)
    found = pruning.orders(
        importances,
        pruning.gradient_importance(module, params, examples),
        pruning.greedy_sequences(attn_NxLxHxTxT, importances, spec.horizon),
        spec.seed,
    )
    out = {}
    for name, order in found.items():
        masks = jnp.asarray(pruning.masks_along(order, cfg.num_layers, cfg.num_heads))
        result = curve(
            module, params, examples, importances, masks, spec.horizon, spec.max_steps, spec.walk
        )
        out[name] = {"order": [list(p) for p in order], **result}
    return out
