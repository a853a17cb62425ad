"""From attention probabilities to the operators whose diffusion the metrics measure.

A head's attention matrix A (rows: queries, columns: keys, rows sum to 1) is the operator
of a feedforward DAG over tokens: a query reads from the keys it attends to. Heads are
mixed into one row-stochastic operator C = sum_h w_h A_h with non-negative weights that sum
to one (the paper's learned head importances, or uniform).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from beyondpar.base import checks


def normalize_weights(weights, num_heads: int, name: str = "weights") -> jax.Array:
    """Head weights `...xH` scaled to sum 1 along the last axis; validated when concrete,
    with errors that call them `name` (the caller's argument) and give the index of the
    first bad entry (or set, for a zero sum)."""
    w = checks.as_float_array(name, weights)
    if w.ndim < 1 or w.shape[-1] != num_heads:
        raise ValueError(
            f"{name} must have last dimension num_heads={num_heads}, got shape {w.shape}"
        )
    if checks.is_concrete(w):
        w_np = np.asarray(w)
        if not np.all(np.isfinite(w_np)):
            raise ValueError(f"{name} must be finite, got NaN or Inf{_at(~np.isfinite(w_np))}")
        if np.any(w_np < 0):
            raise ValueError(
                f"{name} must be non-negative, got minimum {float(w_np.min())}{_at(w_np < 0)}"
            )
        if np.any(w_np.sum(-1) <= 0):
            raise ValueError(
                f"{name} must not be all zero for any set of heads, got a zero sum"
                f"{_at(w_np.sum(-1) <= 0)}"
            )
    return w / jnp.sum(w, axis=-1, keepdims=True)


def _at(bad: np.ndarray) -> str:
    """Where the first True entry of `bad` is, as the user would index it ("at index
    (i, j)"); nothing for a single value (one set of heads)."""
    return f" at index {tuple(int(i) for i in np.argwhere(bad)[0])}" if bad.ndim else ""


def combine_heads(attn, weights=None) -> jax.Array:
    """Mixed operator C = sum_h w_h A_h of attention `...xHxTxT`; uniform weights when None."""
    a = checks.as_float_array("attn", attn)
    if a.ndim < 3:
        raise ValueError(f"attn must have shape (..., H, T, T), got shape {a.shape}")
    num_heads = a.shape[-3]
    if weights is None:
        return jnp.mean(a, axis=-3)
    w = normalize_weights(weights, num_heads).astype(a.dtype)
    return jnp.einsum("...h,...hij->...ij", w, a)


def head_importance(out_kernel, num_heads: int) -> jax.Array:
    """Frobenius norm of each head's block of the attention output projection.

    `out_kernel` is a Flax Dense kernel (in_features x out_features), or a stack of them
    (... x in x out, e.g. one per layer -> ... x H); head h's features are the rows
    [h*d, (h+1)*d), d = in_features / num_heads.
    """
    k = checks.as_float_array("out_kernel", out_kernel)
    num_heads = checks.positive_int("num_heads", num_heads)
    if k.ndim < 2:
        raise ValueError(f"out_kernel must be a 2-D Dense kernel, got shape {k.shape}")
    if k.shape[-2] % num_heads:
        raise ValueError(
            f"num_heads must divide out_kernel's input size {k.shape[-2]}, got {num_heads}"
        )
    blocks = k.reshape(*k.shape[:-2], num_heads, k.shape[-2] // num_heads, k.shape[-1])
    return jnp.sqrt(jnp.sum(blocks * blocks, axis=(-2, -1)))


def dag_operator(
    edges: Iterable[tuple[int, int]], num_nodes: int, self_loops: bool = True
) -> jax.Array:
    """Row-stochastic operator of a DAG given as (sender, receiver) edges.

    Rows are receivers: C[r, s] > 0 when s -> r, so the last node reads what flows into
    it, like a query reading keys. Every node keeps a self-loop by default, as in the
    paper's examples; rows are normalised to sum to 1.
    """
    num_nodes = checks.positive_int("num_nodes", num_nodes)
    adj = np.eye(num_nodes) if self_loops else np.zeros((num_nodes, num_nodes))
    for edge in edges:
        if len(edge) != 2:
            raise ValueError(f"edges must be (sender, receiver) pairs, got {edge!r}")
        sender, receiver = (int(v) for v in edge)
        for node in (sender, receiver):
            if not 0 <= node < num_nodes:
                raise ValueError(f"edge node must be in [0, {num_nodes}), got {node} in {edge}")
        adj[receiver, sender] = 1.0
    sums = adj.sum(axis=1)
    if np.any(sums == 0):
        empty = np.flatnonzero(sums == 0).tolist()
        raise ValueError(f"every node needs an incoming edge or self-loop, got none for {empty}")
    return jnp.asarray(adj / sums[:, None], dtype=jnp.result_type(float))


def _check_rollout(attn, weights, residual):
    a = checks.as_float_array("attn", attn)
    if a.ndim < 4:
        raise ValueError(f"attn must have shape (..., L, H, T, T), got shape {a.shape}")
    checks.unit_interval("residual", residual)
    if weights is not None:
        w = checks.as_float_array("weights", weights)
        if w.ndim < 2 or w.shape[-2:] != a.shape[-4:-2]:
            raise ValueError(
                f"weights must have shape (..., L, H) = (..., {a.shape[-4]}, {a.shape[-3]}), "
                f"got shape {w.shape}"
            )
    return a


def layer_operators(attn, weights=None, residual: float = 0.5) -> jax.Array:
    """A~_l = residual * I + (1 - residual) * C_l for every layer: ...xLxTxT."""
    a = _check_rollout(attn, weights, residual)
    return layer_operator(combine_heads(a, weights), residual)


def layer_operator(mixed_TxT, residual: float = 0.5) -> jax.Array:
    """A~ = residual * I + (1 - residual) * C of one layer's mixed heads C (...xTxT): the
    residual stream keeps `residual` of every position's state."""
    eye = jnp.eye(mixed_TxT.shape[-1], dtype=mixed_TxT.dtype)
    return residual * eye + (1.0 - residual) * mixed_TxT


@jax.jit
def rollout_step(product_TxT, op_TxT) -> jax.Array:
    """One more layer of the rollout: A~ R (...xTxT each)."""
    return jnp.matmul(op_TxT, product_TxT, precision=jax.lax.Precision.HIGHEST)


@jax.jit
def sink_row_step(row_T, op_TxT) -> jax.Array:
    """The sink's row through one more layer, taken from the last layer down: v A~ (O(T^2)
    where `rollout_step` is O(T^3))."""
    return jnp.einsum("...i,...ij->...j", row_T, op_TxT, precision=jax.lax.Precision.HIGHEST)


def rollout(attn, weights=None, residual: float = 0.5) -> jax.Array:
    """Attention rollout R = A~_L ... A~_1 of attention `...xLxHxTxT` (Abnar & Zuidema 2020).

    Each layer's heads are mixed (uniform weights when None, else `...xLxH`) and the
    residual stream is added as `residual * I`; rows stay stochastic. R[i, j] is token
    j's share in position i after the whole network.
    """
    return _rollout(layer_operators(attn, weights, residual))


@jax.jit
def _rollout(ops_LxTxT):
    ops = jnp.moveaxis(ops_LxTxT, -3, 0)
    eye = jnp.broadcast_to(jnp.eye(ops.shape[-1], dtype=ops.dtype), ops.shape[1:])
    return jax.lax.scan(lambda r, op: (rollout_step(r, op), None), eye, ops)[0]


def rollout_sink(attn, weights=None, residual: float = 0.5) -> jax.Array:
    """The sink's row e_tau^T R of the rollout, as L vector-matrix products (O(L T^2)):
    each token's share in what the last position holds after the whole network."""
    return _rollout_sink(layer_operators(attn, weights, residual))


@jax.jit
def _rollout_sink(ops_LxTxT):
    ops = jnp.moveaxis(ops_LxTxT, -3, 0)[::-1]  # e_tau^T A~_L first, A~_1 last
    return jax.lax.scan(lambda v, op: (sink_row_step(v, op), None), _sink(ops[0]), ops)[0]


def _sink(like_TxT) -> jax.Array:
    """e_tau^T for every matrix of `like_TxT`: ...xT."""
    t = like_TxT.shape[-1]
    return jnp.broadcast_to(jax.nn.one_hot(t - 1, t, dtype=like_TxT.dtype), like_TxT.shape[:-1])


def rollout_sink_of_mixed(mixed_layers, residual: float = 0.5) -> jax.Array:
    """`rollout_sink` from the layers' heads already mixed: a sequence, first layer first,
    of ...xTxT operators. One layer's operator exists at a time, so the layers are never
    stacked (a caller keeps only the mixes)."""
    checks.unit_interval("residual", residual)
    if not mixed_layers:
        raise ValueError("mixed_layers must hold at least one layer, got none")
    row = _sink(mixed_layers[-1])
    for mixed in reversed(mixed_layers):
        row = sink_row_step(row, layer_operator(mixed, residual))
    return row


def sink_mass(attn, sink_tokens: int = 1) -> jax.Array:
    """(...) from attention `attn` (..., T, T): mean over queries of the attention on the
    first `sink_tokens` keys.

    Trained language models park attention on the first token (an attention sink);
    a head whose sink mass is near 1 moves almost nothing between the other tokens.
    """
    a = checks.square_matrices("attn", attn)
    k = checks.positive_int("sink_tokens", sink_tokens)
    if k > a.shape[-1]:
        raise ValueError(f"sink_tokens must be at most T={a.shape[-1]}, got {k}")
    return jnp.mean(jnp.sum(a[..., :k], axis=-1), axis=-1)


def drop_sink_tokens(attn, sink_tokens: int) -> jax.Array:
    """(..., T - k, T - k) from attention `attn` (..., T, T): the graph without the first k
    tokens, each row renormalised over the keys that remain. A row that put all its
    attention on the dropped tokens keeps its own token (a self-loop), so every row still
    sums to 1."""
    a = checks.square_matrices("attn", attn)
    t = a.shape[-1]
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int):
        raise ValueError(f"sink_tokens must be an integer, got {sink_tokens!r}")
    if not 0 <= sink_tokens < t - 1:
        raise ValueError(f"sink_tokens must be in [0, {t - 1}) for T={t} tokens, got {sink_tokens}")
    return _drop_sink_tokens(a, sink_tokens)


@functools.partial(jax.jit, static_argnums=1)
def _drop_sink_tokens(a, k: int):
    # One fused pass: a real model's layer is B x H x T x T (75 MB at 8 x 9 x 512).
    rest = a[..., k:, k:]
    total = jnp.sum(rest, axis=-1, keepdims=True)
    eye = jnp.eye(rest.shape[-1], dtype=rest.dtype)
    return jnp.where(total > 0, rest / jnp.where(total > 0, total, 1), eye)


def uniform_causal(num_tokens: int, dtype=jnp.float32) -> jax.Array:
    """(T, T) causal attention spread evenly: A[i, j] = 1 / (i + 1) for j <= i, the
    baseline a measured head is read against."""
    t = checks.positive_int("num_tokens", num_tokens)
    rows = jnp.arange(1, t + 1, dtype=dtype)[:, None]
    return jnp.tril(jnp.ones((t, t), dtype)) / rows


def random_causal(
    seed: int, shape: tuple[int, ...], num_tokens: int, scale: float = 2.0, dtype=np.float32
) -> np.ndarray:
    """(*shape, T, T) synthetic causal attention: softmax of Gaussian scores (standard
    deviation `scale`) under a causal mask, rows summing to 1; seeded, for tests and
    benchmarks that need attention of a known shape without a model."""
    rng = np.random.default_rng(seed)
    t = num_tokens
    scores = scale * rng.standard_normal((*shape, t, t))
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True)).astype(dtype)
    return probs / probs.sum(-1, keepdims=True)
