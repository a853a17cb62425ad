"""Pruning curves of the paper's model: heads removed in each order of `pruning.ORDERS`,
and at every point the accuracy of the masked model with the minimax fidelity and
hitting time of every layer's mix of the heads that remain (a true ablation), layer by
layer so that points share the layers before their masks differ."""

from __future__ import annotations

import concurrent.futures
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics, pruning, tasks
from beyondpar import model as model_lib

MASK_CHUNK = 8  # distinct masks per jitted call, one at a time in memory (T x T per head)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _layer_runs(module, params, layer: int, streams, masks_UxH, importance_H):
    """Per distinct mask: the stream after `layer` and the layer's mix of the heads kept
    (learned weights times mask, renormalised)."""

    def one(args):
        stream, mask = args
        out, attn = model_lib.apply_block(module, params, layer, stream, mask)
        return out, graphs.combine_heads(attn.astype(jnp.float32), importance_H * mask)

    return jax.lax.map(one, (streams, masks_UxH))


@functools.partial(jax.jit, static_argnums=0)
def _accuracies(module, params, streams, examples: tasks.Examples):
    """Accuracy on predictable positions from each stream after the last layer."""

    def one(stream):
        logits = model_lib.unembed(module, params, stream)
        correct = (jnp.argmax(logits, -1) == examples.targets) & examples.predictable
        return jnp.sum(correct) / jnp.maximum(jnp.sum(examples.predictable), 1)

    return jax.lax.map(one, streams)


def _layer(module, params, layer, streams, masks_UxH, importance_H, horizon, max_steps, walk):
    """(streams after `layer`, mean minimax fidelity (U,), mean hitting time (U,)) of each
    distinct mask, chunks from several threads: forward passes on one device leave
    cores idle."""

    def chunk(s):
        part = slice(s, s + MASK_CHUNK)
        out, mixed = _layer_runs(
            module, params, layer, streams[part], masks_UxH[part], importance_H
        )
        # Mixes of the model's softmax rows: row-stochastic, no validation pass, and
        # causal (the model masks every score above the diagonal), no check of that
        # either. The minimax stops once settled (the same values as the full sweep).
        fid = metrics.objective_unchecked(mixed, "fidelity", horizon, max_steps, walk, True)
        hit = metrics.hitting_time(mixed, max_steps, walk, validate=False)
        return out, np.asarray(jnp.mean(fid, axis=1)), np.asarray(jnp.mean(hit, axis=1))

    starts = range(0, len(masks_UxH), MASK_CHUNK)
    with concurrent.futures.ThreadPoolExecutor(min(len(starts), os.cpu_count() or 1)) as pool:
        out, fid, hit = zip(*pool.map(chunk, starts), strict=True)
    return jnp.concatenate(out), np.concatenate(fid), np.concatenate(hit)


def curve(module, params, examples, importances, masks, horizon, max_steps, walk) -> dict:
    """Accuracy (P,) and mean fidelity / hitting time per layer (P, L) along `masks`.

    Points whose masks agree on layers 0..l share those layers' work: each layer runs
    once per distinct mask of the layers up to it. Along an order, where each point
    removes one more head, 16 heads x 4 layers take 154 layer passes instead of 244.
    """
    masks = np.asarray(masks, np.float32)
    importances = jnp.asarray(importances, jnp.float32)
    examples = tasks.Examples(*(jnp.asarray(a) for a in examples))
    streams = model_lib.embed(module, params, examples.inputs)[None]
    source = np.zeros(len(masks), int)  # the stream each point reads, among `streams`
    fidelity, hitting = np.zeros(masks.shape[:2]), np.zeros(masks.shape[:2])
    for layer in range(masks.shape[1]):
        prefix = masks[:, : layer + 1].reshape(len(masks), -1)
        _, first, inverse = np.unique(prefix, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        streams, fid, hit = _layer(
            module,
            params,
            layer,
            streams[jnp.asarray(source[first])],
            jnp.asarray(masks[first, layer]),
            importances[layer],
            horizon,
            max_steps,
            walk,
        )
        fidelity[:, layer], hitting[:, layer] = fid[inverse], hit[inverse]
        source = inverse
    accuracy = np.asarray(_accuracies(module, params, streams, examples))[source]
    pruned = list(range(len(masks)))
    return {
        "heads_pruned": pruned,
        "accuracy": accuracy.tolist(),
        "fidelity": fidelity.tolist(),
        "hitting_time": hitting.tolist(),
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
