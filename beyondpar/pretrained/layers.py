"""Pieces the model families share: causal (optionally windowed, optionally soft-capped)
attention that sows float32 probabilities and takes a head mask, Hugging Face's RMSNorm
(and Gemma's, scaled by 1 + weight), activations by their Hugging Face names, and rotary
embeddings with the feature halves paired, on all or the first part of each head."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = {  # Hugging Face's ACT2FN names
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def attention_mask(t: int, window: int | None) -> jax.Array:
    """(T, T) keys each query may read: j <= i, and i - j < window when one is set (a
    query reads itself and the window - 1 keys before it, as transformers' eager code)."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    return jnp.asarray(allowed)


def causal_attention(
    module: nn.Module,
    q_BxTxHxD,
    k_BxTxKxD,
    v_BxTxKxD,
    scale: float,
    window: int | None = None,
    head_mask=None,
    cap: float | None = None,
):
    """Softmax(q k^T * scale) v under a causal mask, query head h reading kv head h // (H/K).

    Scores and probabilities are float32 whatever the parameters' dtype (as Hugging Face's
    eager attention), and the probabilities (B, H, T, T) are sown as `attention`.
    `head_mask` (H,) or (B, H) scales each head's output before the output projection;
    `cap` soft-caps the scaled scores before the mask (Gemma 2).
    """
    b, t, h, d = q_BxTxHxD.shape
    kv = k_BxTxKxD.shape[2]
    # Heads-major queries, keys and values (small transposes), so that the products come
    # out as B x K x G x T x T and the T x T maps are never transposed (XLA would).
    q = q_BxTxHxD.reshape(b, t, kv, h // kv, d).astype(jnp.float32).transpose(0, 2, 3, 1, 4)
    k = jnp.swapaxes(k_BxTxKxD.astype(jnp.float32), 1, 2)
    scores = jnp.einsum("bkgqd,bksd->bkgqs", q, k) * scale
    scores = softcap(scores.reshape(b, h, t, t), cap)
    allowed = attention_mask(t, window)
    probs = jax.nn.softmax(jnp.where(allowed, scores, jnp.finfo(jnp.float32).min), axis=-1)
    module.sow("intermediates", "attention", probs)
    grouped = probs.reshape(b, kv, h // kv, t, t).astype(v_BxTxKxD.dtype)
    out = jnp.einsum("bkgqs,bksd->bkgqd", grouped, jnp.swapaxes(v_BxTxKxD, 1, 2))
    out = out.reshape(b, h, t, -1).transpose(0, 2, 1, 3)
    if head_mask is not None:
        out = out * jnp.broadcast_to(head_mask, (b, h)).astype(out.dtype)[:, None, :, None]
    return out.reshape(b, t, -1)


class RMSNorm(nn.Module):
    """x / rms(x) * scale, normalised in float32 and cast back before the scale (as HF)."""

    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
        return scale * normed.astype(x.dtype)


class DecoderStack(nn.Module):
    """What every decoder-only family shares: token embedding, the blocks, a final norm and
    an output head (the embedding when tied; else kept as stored, vocab x hidden, and read
    by `attend`: no transpose). A family declares `config` and gives `block(index)`, and
    `final_norm()` when it is not RMSNorm. tokens (B, T) -> logits (B, T, V)."""

    layer_prefix = "layers"

    def block(self, index: int) -> nn.Module:
        raise NotImplementedError

    def final_norm(self) -> nn.Module:
        return RMSNorm(self.config.eps)

    def setup(self):
        cfg = self.config
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.embed_dim)
        self.layers = [self.block(i) for i in range(cfg.num_layers)]
        self.norm = self.final_norm()
        if not cfg.tied:
            self.lm_head = nn.Embed(cfg.vocab_size, cfg.embed_dim)

    def embed(self, tokens_BxT):
        return self.embed_tokens(tokens_BxT)

    def unembed(self, x):
        return (self.embed_tokens if self.config.tied else self.lm_head).attend(self.norm(x))

    def __call__(self, tokens_BxT, head_mask=None):
        x = self.embed(tokens_BxT)
        for i, block in enumerate(self.layers):
            x = block(x, None if head_mask is None else head_mask[..., i, :])
        return self.unembed(x)


def softcap(x, cap: float | None):
    """cap * tanh(x / cap): x kept within (-cap, cap), nearly unchanged when |x| << cap."""
    return x if cap is None else cap * jnp.tanh(x / cap)


class UnitOffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), all in float32, cast back at the end
    (the stored weight is the offset from 1; zeros are the identity scale)."""

    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.zeros, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
        return (normed * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)


def inverse_frequencies(theta: float, rotary_dim: int, factors=None) -> np.ndarray:
    """(rotary_dim / 2,) rotation rates 1 / (factors * theta^(2i / rotary_dim)) in float32
    as transformers forms them: float32 exponents, each power rounded once to float32 (as
    torch's float32 power gives it; NumPy's own float32 power is a bit or two off in one
    rate of six), then float32 products and quotients. Peaked attention between distant
    positions shows a last-bit difference in a rate."""
    powers = rotary_powers(theta, rotary_dim)
    if factors is not None:
        powers = np.asarray(factors, np.float32) * powers
    return np.float32(1.0) / powers


def rotary_powers(theta: float, rotary_dim: int) -> np.ndarray:
    """(rotary_dim / 2,) float32 theta^(2i / rotary_dim), as `inverse_frequencies` forms them."""
    exponents = np.arange(0, rotary_dim, 2).astype(np.float32) / np.float32(rotary_dim)
    return (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)


def rotary_dim(head_dim: int, partial_factor: float) -> int:
    """Features per head that rotate: int(head_dim * factor), as transformers rounds it."""
    return int(head_dim * partial_factor)


def rotary_tables(t: int, inv_freq_half: np.ndarray, scale: float = 1.0):
    """(T, rotary_dim) cos and sin of positions 0..T-1 (times `scale`), built once per
    length in NumPy: the angles in float32 as transformers forms them, their cos and sin
    rounded once from float64, then scaled in float32. Peaked attention between distant
    positions amplifies a last-bit difference here; these tables keep it nearest a
    float64 reference."""
    angles = np.arange(t, dtype=np.float32)[:, None] * np.asarray(inv_freq_half, np.float32)
    angles = np.concatenate([angles, angles], -1).astype(np.float64)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    return cos * np.float32(scale), sin * np.float32(scale)


def rotate_half_split(x_BxTxHxD, inv_freq_half: np.ndarray, scale: float = 1.0):
    """Rotary embedding of positions 0..T-1 with the feature halves paired (HF's layout).

    Only the first 2 * len(inv_freq_half) features of each head rotate; the rest pass
    through (partial rotary, as GPT-NeoX and `partial_rotary_factor` < 1). `scale`
    multiplies cos and sin (longrope's attention factor), as transformers does.
    """
    t = x_BxTxHxD.shape[1]
    rot = 2 * len(inv_freq_half)
    x_rot, x_pass = x_BxTxHxD[..., :rot], x_BxTxHxD[..., rot:]
    cos, sin = rotary_tables(t, inv_freq_half, scale)
    cos, sin = (jnp.asarray(a, x_rot.dtype)[None, :, None, :] for a in (cos, sin))
    x1, x2 = jnp.split(x_rot, 2, axis=-1)
    rotated = x_rot * cos + jnp.concatenate([-x2, x1], -1) * sin
    return jnp.concatenate([rotated, x_pass], -1) if x_pass.shape[-1] else rotated
