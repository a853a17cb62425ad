"""The paper's causal Transformer in Flax Linen, with the head count as a field.

Token + learned position embeddings; pre-norm blocks x += attn(rms(x)); x += mlp(rms(x));
separate q/k/v/output projections with bias; ReLU MLP; an output projection without a
final norm. Changing `num_heads` only re-partitions the same features, so every head count
has the same parameters (172,800 at the paper's size). In eval mode attention
probabilities are sown into the `intermediates` collection, which costs nothing unless it
is asked for; training mode runs attention with its gradient written out
(`attend_with_dropout`).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondpar import graphs
from beyondpar.base import checks
from beyondpar.base.checks import head_mask as check_head_mask  # noqa: F401 - public
from beyondpar.linear import Dense, DenseWeights, dense_together
from beyondpar.norm import RMSNorm

FLOAT32_EPS = float(np.finfo(np.float32).eps)  # PyTorch's RMSNorm default


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the Transformer; defaults are the paper's."""

    vocab_size: int = 256
    embed_dim: int = 64
    num_layers: int = 4
    num_heads: int = 4
    mlp_dim: int = 128
    max_len: int = 100
    dropout_rate: float = 0.1
    norm_eps: float = FLOAT32_EPS

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim", "num_layers", "num_heads", "mlp_dim", "max_len"):
            # NumPy integers become ints: the config is hashed by jit and written as JSON.
            object.__setattr__(self, name, checks.positive_int(name, getattr(self, name)))
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"num_heads must divide embed_dim={self.embed_dim}, got num_heads={self.num_heads}"
            )
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
        checks.positive_number("norm_eps", self.norm_eps)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


def _mix32(x):
    """The 32-bit finaliser of MurmurHash3: a bijection that spreads every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


class Dropout(nn.Module):
    """Inverted dropout whose mask costs a few integer ops per element.

    Attention probabilities hold B*H*T*T elements, and drawing each bit with threefry
    made dropout the slowest part of a 16-head step on CPU. Here each row (last axis) gets
    a seed from a hash of the key and the row's index in the whole batch, and a hash of
    (seed, column) gives each element's 32 bits, so masks stay a pure function of the key
    and the element's index, at a keep probability exact to 2^-32. `data_axis` names the
    axis of a `shard_map` over which the batch is split (None: this is the whole batch):
    each shard then draws its own rows of the whole batch's mask, the same on any number
    of devices.
    """

    rate: float
    rescale: bool = True  # False: the caller scales by 1 / keep_probability (elsewhere)
    data_axis: str | None = None

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        seeds = self.row_seeds(x.shape)
        scaled = x / keep_probability(self.rate) if self.rescale else x
        return jnp.where(kept_elements(seeds, x.shape[-1], self.rate), scaled, jnp.zeros_like(x))

    def row_seeds(self, shape) -> jax.Array:
        """One seed per row of an array of `shape`, from the `dropout` stream."""
        words = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
        first = 0 if self.data_axis is None else lax.axis_index(self.data_axis) * shape[0]
        return row_seeds(words, shape[:-1], first)


def row_seeds(words, rows_shape, first_sequence=0) -> jax.Array:
    """Seeds of rows `rows_shape` (sequences first) from two uint32 key `words`: a
    bijective hash of each row's index in a batch whose sequence `first_sequence` is this
    one's first, so distinct rows of one key never share a seed."""
    per_sequence = int(np.prod(rows_shape[1:], dtype=np.int64))
    index = jnp.arange(int(np.prod(rows_shape, dtype=np.int64)), dtype=jnp.uint32)
    index = index + jnp.asarray(first_sequence, jnp.uint32) * jnp.uint32(per_sequence)
    return _mix32(_mix32(index ^ words[0]) ^ words[1]).reshape(rows_shape)


def kept_elements(seeds, columns: int, rate: float) -> jax.Array:
    """The elements `Dropout(rate)` keeps, from each row's seed and the column index."""
    index = jnp.arange(columns, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
    return _mix32(seeds[..., None] ^ index) >= jnp.uint32(_threshold(rate))


def _threshold(rate: float) -> int:
    return min(round(rate * 2.0**32), 2**32 - 1)


def keep_probability(rate: float) -> float:
    """The exact share of elements `Dropout(rate)` keeps (a 32-bit threshold)."""
    return 1.0 - _threshold(rate) / 2.0**32


QUERY_SPLIT_TOKENS_PER_HEAD_DIM = 6


def query_blocks(tokens: int, head_dim: int) -> tuple[tuple[int, int], ...]:
    """The (first, end) query rows training attention computes at a time.

    Queries before row `end` read only keys before it, so the first half of the queries
    skips the second half of the keys: the T x T tensors shrink by a quarter. That pays
    where those tensors outweigh the T x Dh ones (small heads: 4, 8 and 16 heads at the
    paper's T = 100 and d = 64; at 4 heads the step is 3-4% faster split, measured in
    four interleaved rounds); with wide heads the second set of products costs more than
    it saves, so they stay whole.
    """
    if tokens >= QUERY_SPLIT_TOKENS_PER_HEAD_DIM * head_dim:
        return ((0, tokens // 2), (tokens // 2, tokens))
    return ((0, tokens),)


def causal_softmax(q, k, first_query: int = 0) -> jax.Array:
    """Attention probabilities B x H x Q x K of (pre-scaled) queries and keys, where the
    queries are rows first_query, first_query + 1, ... of the sequence and the keys its
    first K tokens: query i reads keys up to first_query + i."""
    return jax.nn.softmax(_causal_scores(q, k, first_query), axis=-1)


def _causal_scores(q, k, first_query: int) -> jax.Array:
    """Scores of `causal_softmax`, -inf where a query would read a later key."""
    rows, cols = q.shape[-2], k.shape[-2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
    # -inf added above the diagonal rather than selected in: on CPU the addition joins the
    # product's fused pass instead of making a pass over B x H x T x T of its own. (A
    # non-finite future score now makes its row NaN; a select would have hidden it.)
    past = jnp.tril(jnp.ones((rows, cols), bool), first_query)
    future = jnp.where(past, 0, -jnp.inf).astype(scores.dtype)
    return scores + future


def _causal_exponentials(q, k, first_query: int) -> tuple[jax.Array, jax.Array]:
    """`causal_softmax` before its division: exp(score - row max) and 1 / each row's sum.
    Training scales the heads' outputs (Q x Dh) by the second instead of the Q x K
    probabilities: the forward makes one pass fewer over the largest tensor, and the
    backward reads the exponentials where it read the probabilities."""
    scores = _causal_scores(q, k, first_query)
    exps = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    return exps, 1 / jnp.sum(exps, axis=-1, keepdims=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attend_with_dropout(q, k, v, seeds, rate: float) -> jax.Array:
    """Heads' outputs B x H x T x Dh: causal attention probabilities with `Dropout(rate)`'s
    elements (from the rows' `seeds`) dropped, times `v`, unscaled; `seeds` None (with
    rate 0): nothing dropped.

    Its gradient is written out because it can skip a pass over the B x H x T x T tensors:
    the softmax's backward needs each row's sum of probability x gradient, which here is
    the row of the output times its gradient (T x Dh, not T x T). Both directions run over
    `query_blocks`, each block against only the keys it can read."""
    return _attend_forward(q, k, v, seeds, rate)[0]


def _attend_forward(q, k, v, seeds, rate):
    outs, exps, scales = [], [], []
    for first, end in query_blocks(q.shape[-2], q.shape[-1]):
        block_exps, scale = _causal_exponentials(q[..., first:end, :], k[..., :end, :], first)
        kept_exps = _kept(block_exps, seeds, first, end, rate)
        outs.append(jnp.einsum("bhqk,bhkd->bhqd", kept_exps, v[..., :end, :]) * scale)
        exps.append(block_exps)
        scales.append(scale)
    out = jnp.concatenate(outs, axis=-2)
    return out, (q, k, v, seeds, tuple(exps), jnp.concatenate(scales, axis=-2), out)


def _attend_backward(rate, residuals, d_out):
    q, k, v, seeds, exps, scale, out = residuals
    tokens = q.shape[-2]
    # Softmax backward: probs * (d_probs - rowsum(probs * d_probs)), and that row sum is
    # rowsum(kept probs * (d_out . v)) = d_out . out. Masked entries have probability 0,
    # so the causal mask needs no gradient of its own. The probabilities are exps x scale
    # (one scale per query row), and the scale goes on the Q x Dh side of every product.
    row = jnp.einsum("bhqd,bhqd->bhq", d_out, out)[..., None] * scale
    d_out = d_out * scale
    d_q, d_k_by_block, d_v_by_block = [], [], []
    for (first, end), block_exps in zip(query_blocks(tokens, q.shape[-1]), exps, strict=True):
        block_d_out = d_out[..., first:end, :]
        kept_exps = _kept(block_exps, seeds, first, end, rate)
        d_v_by_block.append(_contract_rows(kept_exps, block_d_out, tokens))
        d_kept = jnp.einsum("bhqd,bhkd->bhqk", block_d_out, v[..., :end, :])
        d_kept = _kept(d_kept, seeds, first, end, rate)
        d_scores = block_exps * (d_kept - row[..., first:end, :])
        d_q.append(jnp.einsum("bhqk,bhkd->bhqd", d_scores, k[..., :end, :]))
        d_k_by_block.append(_contract_rows(d_scores, q[..., first:end, :], tokens))
    d_q = jnp.concatenate(d_q, axis=-2)
    # Summed transposed (B x H x Dh x T), as `_contract_rows` leaves them, then turned once.
    d_k = functools.reduce(jnp.add, d_k_by_block).swapaxes(-1, -2)
    d_v = functools.reduce(jnp.add, d_v_by_block).swapaxes(-1, -2)
    # Each input's own dtype: queries may be wider than keys and values (x64 scaling).
    return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None


def _kept(block, seeds, first: int, end: int, rate: float) -> jax.Array:
    """A query block's Q x K tensor with the elements dropout drops set to 0 (as is
    where `seeds` is None: no dropout)."""
    if seeds is None:
        return block
    return jnp.where(kept_elements(seeds[..., first:end], end, rate), block, 0)


CONTRACT_BY_SUM_HEAD_DIM = 4


def _contract_rows(wide, narrow, keys: int) -> jax.Array:
    """einsum("bhqk,bhqd->bhdk", wide, narrow) zero-padded to `keys` columns: a B x H x Q x K
    tensor's columns times a B x H x Q x Dh one, summed over their rows (the gradients of
    values and keys from one query block), left transposed.

    XLA's CPU dot runs this form, the wide operand contracted over its rows, several times
    slower than the same sums with the narrow operand first (3x at 16 heads of 4 dims).
    The barrier keeps its simplifier from folding a transpose after the product back into
    the slow form; the caller transposes once, after summing the blocks. Heads of at most
    `CONTRACT_BY_SUM_HEAD_DIM` dims skip the product: a dot with so few output rows runs
    at a tenth of the matmul rate, and one fused multiply-and-sum over the rows is 1.6x
    to 1.8x faster (16 heads of 4 dims)."""
    if narrow.shape[-1] <= CONTRACT_BY_SUM_HEAD_DIM:
        product = jnp.sum(wide[..., None, :] * narrow[..., None], axis=-3)
    else:
        product = lax.optimization_barrier(jnp.einsum("bhqd,bhqk->bhdk", narrow, wide))
    padding = [(0, 0)] * (product.ndim - 1) + [(0, keys - product.shape[-1])]
    return jnp.pad(product, padding)


attend_with_dropout.defvjp(_attend_forward, _attend_backward)


class CausalSelfAttention(nn.Module):
    config: ModelConfig
    data_axis: str | None = None  # see `Dropout`

    @nn.compact
    def __call__(self, x_BxTxD, deterministic: bool, head_mask=None):
        """`head_mask` (H,) or (B, H) multiplies each head's output before the output
        projection: 0 removes a head, 1 keeps it (None: no multiply at all)."""
        cfg = self.config
        b, t, d = x_BxTxD.shape
        # Heads next to batch: the score and value products become plain batched matmuls.
        split = lambda y: y.reshape(b, t, cfg.num_heads, cfg.head_dim).transpose(0, 2, 1, 3)
        # Scaling q (B*T*D values) rather than the scores (B*H*T*T) keeps H out of it.
        weights = [DenseWeights(d, name=name)(x_BxTxD) for name in ("query", "key", "value")]
        q, k, v = map(split, dense_together(x_BxTxD, weights))
        q = q / np.sqrt(cfg.head_dim)
        if deterministic:
            probs_BxHxTxT = causal_softmax(q, k)
            self.sow("intermediates", "attention", probs_BxHxTxT)
            out = jnp.einsum("bhqk,bhkd->bhqd", probs_BxHxTxT, v)
        else:
            # Training, with or without dropout: the written-out gradient of
            # `attend_with_dropout` (autodiff of the softmax costs 2-3x at 4+ heads).
            seeds = None
            if cfg.dropout_rate > 0:
                seeds = Dropout(cfg.dropout_rate, data_axis=self.data_axis).row_seeds(
                    (b, cfg.num_heads, t, t)
                )
                # Dropout's 1 / keep scale goes on the values (B x T x D), not on the
                # B x H x T x T probabilities: the backward pass then has no full-size
                # tensor of that constant.
                v = v / keep_probability(cfg.dropout_rate)
            out = attend_with_dropout(q, k, v, seeds, cfg.dropout_rate)
        out = out.transpose(0, 2, 1, 3)
        if head_mask is not None:
            mask = jnp.broadcast_to(head_mask, (b, cfg.num_heads)).astype(out.dtype)
            out = out * mask[:, None, :, None]
        return Dense(d, name="out")(out.reshape(b, t, d))


class Mlp(nn.Module):
    config: ModelConfig
    data_axis: str | None = None

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        h = nn.relu(Dense(cfg.mlp_dim, name="hidden")(x))
        h = Dense(cfg.embed_dim, name="output")(h)
        return Dropout(cfg.dropout_rate, data_axis=self.data_axis)(h, deterministic=deterministic)


class Block(nn.Module):
    config: ModelConfig
    data_axis: str | None = None

    @nn.compact
    def __call__(self, x, deterministic: bool, head_mask=None):
        eps = self.config.norm_eps
        x = x + CausalSelfAttention(self.config, self.data_axis, name="attn")(
            RMSNorm(eps, name="ln1")(x), deterministic, head_mask
        )
        return x + Mlp(self.config, self.data_axis, name="mlp")(
            RMSNorm(eps, name="ln2")(x), deterministic
        )


class Transformer(nn.Module):
    """tokens (B, T) int -> logits (B, T, vocab).

    `head_mask` (L, H) or per sequence (B, L, H) scales each head's output before its
    layer's output projection (see `CausalSelfAttention`); None leaves the model as is.
    `data_axis`: the `shard_map` axis the batch is split over in training (see `Dropout`).
    """

    config: ModelConfig
    data_axis: str | None = None

    @nn.compact
    def __call__(self, tokens_BxT, deterministic: bool = True, head_mask=None):
        cfg = self.config
        t = tokens_BxT.shape[-1]
        if t > cfg.max_len:
            raise ValueError(f"sequence length must be <= max_len={cfg.max_len}, got {t}")
        x = nn.Embed(cfg.vocab_size, cfg.embed_dim, name="token_emb")(tokens_BxT)
        x = x + nn.Embed(cfg.max_len, cfg.embed_dim, name="pos_emb")(jnp.arange(t))
        for i in range(cfg.num_layers):
            layer_mask = None if head_mask is None else head_mask[..., i, :]
            x = Block(cfg, self.data_axis, name=f"layers_{i}")(x, deterministic, layer_mask)
        return Dense(cfg.vocab_size, name="head")(x)


def embed(module: Transformer, params, tokens_BxT) -> jax.Array:
    """The residual stream entering layer 0: token plus position embeddings."""
    cfg = module.config
    t = tokens_BxT.shape[-1]
    tokens = nn.Embed(cfg.vocab_size, cfg.embed_dim).apply(
        {"params": params["token_emb"]}, tokens_BxT
    )
    return tokens + nn.Embed(cfg.max_len, cfg.embed_dim).apply(
        {"params": params["pos_emb"]}, jnp.arange(t)
    )


def apply_block(module: Transformer, params, layer: int, x_BxTxD, head_mask=None):
    """(the stream after `layer`, its attention B x H x T x T) in eval mode: one layer of
    `Transformer`, for work that shares the layers before a change (pruning curves)."""
    return apply_layer(module, params[f"layers_{layer}"], x_BxTxD, head_mask)


def apply_layer(module: Transformer, layer_params, x_BxTxD, head_mask=None):
    """`apply_block` from one layer's parameters: one compiled program serves every layer."""
    out, state = Block(module.config).apply(
        {"params": layer_params},
        x_BxTxD,
        True,
        head_mask,
        mutable=["intermediates"],
    )
    return out, state["intermediates"]["attn"]["attention"][0]


def unembed(module: Transformer, params, x_BxTxD) -> jax.Array:
    """Logits from the stream after the last layer."""
    return nn.Dense(module.config.vocab_size).apply({"params": params["head"]}, x_BxTxD)


def init_params(module: Transformer, key: jax.Array, seq_len: int | None = None):
    """Parameters for `module` from `key` (a dummy batch of one sequence)."""
    tokens = jnp.zeros((1, seq_len or module.config.max_len), jnp.int32)
    # The head count and dropout do not change the parameters: one program serves them all.
    shapes_only = dataclasses.replace(module.config, num_heads=1, dropout_rate=0.0)
    return _init_params(Transformer(shapes_only), key, tokens)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(module: Transformer, key, tokens):
    """`module.init`'s parameters, jitted: run op by op, a fresh process spent seconds
    compiling the initialisers' small operations one at a time. (The paper's sizes get
    the same bits; other sizes may differ in the last bit of a normal sample.)"""
    return module.init(key, tokens)["params"]


def head_importances(module: Transformer, params) -> jax.Array:
    """(L, H): the Frobenius norm of each head's block of each layer's output projection,
    the paper's learned head weights."""
    cfg = module.config
    kernels = [params[f"layers_{i}"]["attn"]["out"]["kernel"] for i in range(cfg.num_layers)]
    return graphs.head_importance(jnp.stack(kernels), cfg.num_heads)


def count_params(params) -> int:
    return int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))


def apply_with_attention(module: Transformer, params, tokens_BxT, head_mask=None):
    """Eval-mode logits (B, T, V) and the attention of every layer (B, L, H, T, T)."""
    if head_mask is not None and checks.is_concrete(head_mask):
        head_mask = checks.head_mask(head_mask, module.config)
    logits, state = module.apply(
        {"params": params},
        tokens_BxT,
        deterministic=True,
        head_mask=head_mask,
        mutable=["intermediates"],
    )
    layers = state["intermediates"]
    attn = [layers[f"layers_{i}"]["attn"]["attention"][0] for i in range(module.config.num_layers)]
    return logits, jnp.stack(attn, axis=1)
