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

from beyondpar import batches, graphs, metrics, pruning
from beyondpar import model as model_lib

MASK_GROUP = 16  # masks per jitted call that share one input stream (and its attention)
MIX_BYTES = 256 * 2**20  # ... fewer when their mixes (B x T x T each) would exceed this


@functools.partial(jax.jit, static_argnums=0)
def _group_runs(module, layer_params, stream, masks_GxH, importance_H):
    """Per mask of a group that reads the same stream: the stream after the layer and the
    layer's mix of the heads kept (learned weights times mask, renormalised).

    The mask scales the heads' outputs after their attention, so under `vmap` over the
    masks the attention is computed once for the whole group, not once per mask.
    """

    def one(mask):
        out, attn = model_lib.apply_layer(module, layer_params, stream, mask)
        return out, graphs.combine_heads(attn.astype(jnp.float32), importance_H * mask)

    return jax.vmap(one)(masks_GxH)


@functools.partial(jax.jit, static_argnums=0)
def _accuracies(module, params, streams, batch: batches.Batch):
    """Accuracy on predictable positions from each stream after the last layer."""

    def one(stream):
        return batches.accuracy(model_lib.unembed(module, params, stream), batch)

    return jax.lax.map(one, streams)


def _groups(inputs_U, limit: int) -> list[np.ndarray]:
    """Indices of the masks that read each input stream, in groups of at most `limit`."""
    groups = []
    for s in np.unique(inputs_U):
        members = np.flatnonzero(inputs_U == s)
        groups += [members[i : i + limit] for i in range(0, len(members), limit)]
    return groups


def _padded(group: np.ndarray) -> np.ndarray:
    """The group repeated at its last member up to a power of two: few compiled sizes."""
    size = 1 << (len(group) - 1).bit_length()
    return np.concatenate([group, np.repeat(group[-1:], size - len(group))])


def group_limit(batch: int, tokens: int) -> int:
    """The most masks per call: at most `MASK_GROUP`, and a power of two whose mixes
    (batch x tokens x tokens float32 each) fit in `MIX_BYTES`, so that padding a group
    to a power of two never takes it over the budget (one mask at the least)."""
    fits = max(1, min(MASK_GROUP, MIX_BYTES // (batch * tokens * tokens * 4)))
    return 1 << (fits.bit_length() - 1)


def _layer(module, layer_params, streams, inputs_U, masks_UxH, importance_H, spec):
    """(streams after the layer (U, B, T, D), mean minimax fidelity (U,), mean hitting
    time (U,)) of each distinct mask, which reads stream `inputs_U[u]` of `streams`.
    Groups run from several threads: forward passes on one device leave cores idle."""
    horizon, max_steps, walk = spec
    limit = group_limit(streams.shape[1], streams.shape[2])

    def run(group):
        pad = _padded(group)
        out, mixed = _group_runs(
            module, layer_params, streams[inputs_U[group[0]]], masks_UxH[pad], importance_H
        )
        out, mixed = out[: len(group)], mixed[: len(group)]
        # Mixes of the model's softmax rows: row-stochastic, no validation pass, and
        # causal (the model masks every score above the diagonal), no check of that
        # either. The minimax stops once settled (the same values as the full sweep).
        fid = metrics.objective_unchecked(mixed, "fidelity", horizon, max_steps, walk, True)
        hit = metrics.hitting_time(mixed, max_steps, walk, validate=False)
        return out, np.asarray(jnp.mean(fid, axis=1)), np.asarray(jnp.mean(hit, axis=1))

    groups = _groups(np.asarray(inputs_U), limit)
    with concurrent.futures.ThreadPoolExecutor(min(len(groups), os.cpu_count() or 1)) as pool:
        out, fid, hit = zip(*pool.map(run, groups), strict=True)
    order = np.argsort(np.concatenate(groups))  # back to the order of the masks
    return jnp.concatenate(out)[order], np.concatenate(fid)[order], np.concatenate(hit)[order]


def curve(module, params, batch, importances, masks, horizon, max_steps, walk) -> dict:
    """Accuracy (P,) and mean fidelity / hitting time per layer (P, L) along `masks`.

    Points whose masks agree on layers 0..l share those layers' work: each layer runs
    once per distinct mask of the layers up to it, and its attention once per distinct
    stream entering it. Along an order, where each point removes one more head, 16 heads x
    4 layers take 154 layer passes instead of 244, with 94 attention passes.
    """
    masks = np.asarray(masks, np.float32)
    importances = jnp.asarray(importances, jnp.float32)
    batch = batches.Batch(*(jnp.asarray(a) for a in batch))
    streams = model_lib.embed(module, params, batch.inputs)[None]
    source = np.zeros(len(masks), int)  # the stream each point reads, among `streams`
    fidelity, hitting = np.zeros(masks.shape[:2]), np.zeros(masks.shape[:2])
    spec = (horizon, max_steps, walk)
    for layer in range(masks.shape[1]):
        prefix = masks[:, : layer + 1].reshape(len(masks), -1)
        _, first, inverse = np.unique(prefix, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        streams, fid, hit = _layer(
            module,
            params[f"layers_{layer}"],
            streams,
            source[first],
            jnp.asarray(masks[first, layer]),
            importances[layer],
            spec,
        )
        fidelity[:, layer], hitting[:, layer] = fid[inverse], hit[inverse]
        source = inverse
    accuracy = np.asarray(_accuracies(module, params, streams, batch))[source]
    pruned = list(range(len(masks)))
    return {
        "heads_pruned": pruned,
        "accuracy": accuracy.tolist(),
        "fidelity": fidelity.tolist(),
        "hitting_time": hitting.tolist(),
        "auc": pruning.area(accuracy, pruned, len(masks) - 1),
    }


def pruning_curves(module, params, batch, importances, attn_NxLxHxTxT, spec) -> dict:
    """{order: {"order": [(layer, head)], "accuracy", "fidelity", "hitting_time", "auc"}}
    for every order, pruning from all heads to one head per layer. `spec` gives horizon,
    max_steps, walk and seed (an `evaluate.EvalSpec`)."""
    cfg = module.config
    params = jax.device_get(params)  # on the default device, with everything else here
    batch = batches.Batch(*(np.asarray(a) for a in batch))
    importances = np.asarray(importances, np.float32)
    attn_NxLxHxTxT = np.asarray(attn_NxLxHxTxT)
    found = pruning.orders(
        importances,
        pruning.gradient_importance(module, params, batch),
        pruning.greedy_sequences(attn_NxLxHxTxT, importances, spec.horizon),
        spec.seed,
    )
    out = {}
    for name, order in found.items():
        masks = jnp.asarray(pruning.masks_along(order, cfg.num_layers, cfg.num_heads))
        result = curve(
            module, params, batch, importances, masks, spec.horizon, spec.max_steps, spec.walk
        )
        out[name] = {"order": [list(p) for p in order], **result}
    return out
