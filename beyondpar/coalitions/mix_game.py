"""The value of a coalition of heads: the objective of its mix, as a `value_fn`.

A value function is the common currency of this package: it maps a (K, H) 0/1 batch of
coalition masks to (B, K) values, one per set of heads (sequence) and coalition. `mix_value_fn`
builds the one of the attention metrics; any other (a model's loss with the heads outside
the coalition masked, say) plugs into `values` and `sampled_shapley` the same way.

A coalition's mix renormalises the head weights over its members: C_S = sum_{h in S} w_h
A_h / sum_{h in S} w_h (uniform over the members when no weights are given). The mixes of
a block of coalitions are ONE product, (normalised mask rows) @ (heads), formed and
measured in cache (`kernel`); calls come in a few shapes (a power of two of blocks), so
each objective compiles a few times per layer shape. The table of every coalition
(`values`) forms each mix as the sum of two parts of its index instead (one add per
entry), in calls of one shape.

The empty coalition mixes nothing, and neither does a coalition whose members all weigh 0:
it counts as the identity operator, every token keeping its own state (the kernels pad
batches with it too). Its minimax fidelity is 0 (no token but the sink ever reaches the
sink) and its hitting time is max_steps (T - 1) / T (no walk ever arrives; the sink counts
0): the value of no propagation, the worst either objective can be.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import tqdm

from beyondpar import metrics
from beyondpar.base import checks
from beyondpar.coalitions import game, kernel

OBJECTIVES = ("fidelity", "hitting_time")
HORIZON = 100  # the metric kernels' and the per-layer measurement's horizon and max_steps
WALK = "reference"  # the metric kernels' walk (the paper's estimator)
MAX_EXACT_HEADS = 16  # 65,536 coalitions; beyond, sample (`sampled_shapley`)
PROGRESS_CHUNK = 4096  # coalitions per step of the progress bar

ValueFn = Callable[[np.ndarray], np.ndarray]


def empty_value(objective: str, num_tokens: int, horizon: int) -> float:
    """The value of the empty coalition (the identity operator, see the module)."""
    return 0.0 if objective == "fidelity" else horizon * (num_tokens - 1) / num_tokens


def mix_value_fn(
    attn_BxHxTxT,
    weights_H=None,
    objective: str = "fidelity",
    horizon: int | None = None,
    walk: str = WALK,
    block_size: int | None = None,
) -> MixGame:
    """value_fn(masks_KxH) -> (B, K) NumPy in the attention's dtype: the objective of each
    coalition's mix (a `MixGame`, which also tabulates every coalition fast).

    `attn_BxHxTxT`: B sets of H heads' attention (checked once, here); `weights_H`: (H,) or
    (B, H) non-negative head weights, None for uniform; `objective`: "fidelity" (minimax
    fidelity) or "hitting_time" (on `walk`); `horizon`: the fidelity's horizon or the
    hitting time's max_steps (None: 100, as the per-layer measurement); `block_size`:
    coalitions per block (None: as many mixes as fit the cache, `kernel.block_size`)."""
    a = metrics.check_operator(checks.as_float_array("attn_BxHxTxT", attn_BxHxTxT), "attn_BxHxTxT")
    if a.ndim != 4:
        raise ValueError(f"attn_BxHxTxT must have shape (B, H, T, T), got shape {a.shape}")
    objective = checks.one_of("objective", objective, OBJECTIVES)
    walk = checks.one_of("walk", walk, metrics.WALKS)
    horizon = HORIZON if horizon is None else checks.positive_int("horizon", horizon)
    b, h, t = a.shape[0], a.shape[1], a.shape[-1]
    block = kernel.block_size(b, t, a.dtype.itemsize)
    if block_size is not None:
        block = checks.positive_int("block_size", block_size)
    w = np.asarray(_weights(weights_H, b, h), np.float64)
    settings = dict(objective=objective, horizon=horizon, walk=walk)
    return MixGame(a, w, block, settings, empty_value(objective, t, horizon))


class MixGame:
    """The game of the mixes of a layer's heads (`mix_value_fn`): called on a (K, H) mask
    batch it gives (B, K) values; `every_coalition` tabulates all 2^H of them."""

    def __init__(self, attn, weights_BxH, block: int, settings: dict, empty: float):
        self.attn, self.weights, self.block = attn, weights_BxH, block
        self.settings, self.empty = settings, empty
        self.num_heads = attn.shape[1]

    def __call__(self, masks_KxH) -> np.ndarray:
        m = check_masks(masks_KxH, self.num_heads)
        mix = m[None] * self.weights[:, None, :]  # B x K x H
        total = mix.sum(-1)
        nonempty = np.flatnonzero((total > 0).any(0))
        out = np.full((len(mix), len(m)), self.empty, self.attn.dtype)
        # Calls of a few shapes: a power of two of blocks, at most a chunk's worth.
        most = self.block * _power_of_two(-(-PROGRESS_CHUNK // self.block))
        size = min(most, self.block * _power_of_two(-(-len(nonempty) // self.block)))
        for start in range(0, len(nonempty), size):
            part = nonempty[start : start + size]
            rows = np.where(total[:, part, None] > 0, mix[:, part], 1.0)  # 1: any valid mix
            rows = kernel.padded_rows(rows / rows.sum(-1, keepdims=True), size)
            values = kernel.measure_mixes(
                self.attn, jnp.asarray(rows, self.attn.dtype), block=self.block, **self.settings
            )
            out[:, part] = np.where(
                total[:, part] > 0, np.asarray(values)[:, : len(part)], self.empty
            )
        return out

    def every_coalition(self, progress: bool = False) -> np.ndarray:
        """(B, 2^H) in index order, each block one high part of the index and every low
        part (`kernel.measure_coalitions`), in calls of one shape."""
        h = self.num_heads
        low = min(h, max(0, self.block.bit_length() - 1))  # 2^low mixes per block
        highs = 2 ** (h - low)
        count = min(highs, max(1, PROGRESS_CHUNK >> low))
        w = jnp.asarray(self.weights, self.attn.dtype)
        parts = []
        bar = tqdm.tqdm(total=2**h, desc="coalitions", unit="coalition", disable=not progress)
        with bar:
            for first in range(0, highs, count):
                part = kernel.measure_coalitions(self.attn, w, first, count, low, **self.settings)
                parts.append(np.asarray(part))
                bar.update(count << low)
        out = np.concatenate(parts, axis=-1)
        weightless = self.weights @ game.coalition_masks(h).T <= 0
        return np.where(weightless, self.empty, out).astype(self.attn.dtype)


def _weights(weights_H, b: int, h: int) -> np.ndarray:
    """(B, H) head weights, each row scaled to sum 1 (uniform when None)."""
    if weights_H is None:
        return np.full((b, h), 1.0 / h)
    try:
        w = np.asarray(weights_H, np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"weights_H must be an array of numbers, got {weights_H!r}") from err
    if w.shape not in ((h,), (b, h)):
        raise ValueError(f"weights_H must have shape ({h},) or ({b}, {h}), got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or np.any(w.sum(-1) <= 0):
        raise ValueError(
            f"weights_H must be finite, non-negative and not all zero for any set of heads, got {w}"
        )
    return np.broadcast_to(w / w.sum(-1, keepdims=True), (b, h))


def check_masks(masks_KxH, num_heads: int) -> np.ndarray:
    """(K, H) coalition masks as float64 0/1, checked."""
    m = np.asarray(masks_KxH, np.float64)
    if m.ndim != 2 or m.shape[1] != num_heads or not np.isin(m, (0.0, 1.0)).all():
        raise ValueError(f"masks_KxH must be a (K, {num_heads}) array of 0/1, got shape {m.shape}")
    return m


def _power_of_two(n: int) -> int:
    """The smallest power of two at least n (1 for n = 0)."""
    return 1 << max(0, n - 1).bit_length()


def check_exact(num_heads: int) -> int:
    """`num_heads`, checked to allow a table of every coalition."""
    h = checks.positive_int("num_heads", num_heads)
    if h > MAX_EXACT_HEADS:
        raise ValueError(
            f"num_heads must be at most {MAX_EXACT_HEADS} for every coalition, got {h}: "
            "sample Shapley values instead (sampled_shapley, or shapley_values(samples=...))"
        )
    return h


def all_values(value_fn: ValueFn, num_heads: int, progress: bool = False) -> np.ndarray:
    """(B, 2^H): `value_fn` on every coalition, in index order (bit h = head h), in chunks
    with a progress bar when `progress`."""
    h = check_exact(num_heads)
    masks = game.coalition_masks(h)
    parts = []
    with tqdm.tqdm(
        total=len(masks), desc="coalitions", unit="coalition", disable=not progress
    ) as bar:
        for start in range(0, len(masks), PROGRESS_CHUNK):
            chunk = masks[start : start + PROGRESS_CHUNK]
            parts.append(np.asarray(value_fn(chunk)))
            bar.update(len(chunk))
    return np.concatenate(parts, axis=-1)


def values(
    attn_BxHxTxT=None,
    weights_H=None,
    objective: str = "fidelity",
    horizon: int | None = None,
    walk: str = WALK,
    value_fn: ValueFn | None = None,
    num_heads: int | None = None,
    progress: bool = False,
) -> np.ndarray:
    """(B, 2^H), in the attention's dtype: the value of every coalition S of heads, v(S) =
    the objective of S's mix (`mix_value_fn`: weights renormalised over S, uniform when
    `weights_H` is None). Index c is a bitmask: head h is a member of coalition c when bit
    h of c is set (c & (1 << h)); v[:, 0] is the empty coalition (fidelity 0, hitting time
    horizon (T - 1) / T: no propagation, see the module) and v[:, -1] all heads.

    Exact, up to 16 heads. With `value_fn` (and `num_heads`) instead of attention, any
    value function's game, e.g. a model's loss under head masks."""
    if value_fn is None:
        if attn_BxHxTxT is None:
            raise ValueError("values needs attn_BxHxTxT or value_fn, got neither")
        value_fn = mix_value_fn(attn_BxHxTxT, weights_H, objective, horizon, walk)
        num_heads = value_fn.num_heads
    if isinstance(value_fn, MixGame) and num_heads in (None, value_fn.num_heads):
        check_exact(value_fn.num_heads)
        return value_fn.every_coalition(progress)
    if num_heads is None:
        num_heads = getattr(value_fn, "num_heads", None)
        if num_heads is None:
            raise ValueError("values with a value_fn needs num_heads, got None")
    return all_values(value_fn, num_heads, progress)
