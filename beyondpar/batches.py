"""The batch every workflow scores a model on, and its accuracy.

A batch holds sequences a causal model reads, the token each position should predict,
and which positions it can predict at all (it sees inputs[..., : i + 1] at position i):
the synthetic tasks make them, the study trains and evaluates on them, the analysis
builds them from corpus windows, and head pruning scores models on them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class Batch(NamedTuple):
    inputs: jax.Array  # N x T int32
    targets: jax.Array  # N x T int32
    predictable: jax.Array  # N x T bool


def predictable_hits(logits_NxTxV, batch: Batch, axis=None):
    """(hits, count): the predictable positions whose most likely token is the target,
    and the predictable positions, summed over `axis` of N x T (None: all of them).

    Array methods only, so that NumPy inputs give NumPy counts (and float64 accuracy)
    and traced inputs stay inside jit."""
    correct = (logits_NxTxV.argmax(-1) == batch.targets) & batch.predictable
    return correct.sum(axis), batch.predictable.sum(axis)


def accuracy(logits_NxTxV, batch: Batch, axis=None):
    """Accuracy on predictable positions over `axis` of N x T (None: pooled over the
    batch; -1: per sequence); 0 where there is none."""
    hits, count = predictable_hits(logits_NxTxV, batch, axis)
    return hits / count.clip(min=1)
