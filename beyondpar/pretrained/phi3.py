"""Phi-3 (model_type "phi3": Phi-3, Phi-3.5, Phi-4-mini) as Hugging Face stores it.

Llama's block with two fused projections: `qkv_proj` holds the query rows, then the key
rows, then the value rows, and `gate_up_proj` the gate rows, then the up rows. Rotary on
the first `partial_rotary_factor` of each head; `longrope` scaling (Phi-3-128k, Phi-3.5)
takes the short factors for texts of at most `original_max_position_embeddings` tokens
and the long ones beyond, with its attention factor on cos and sin (as transformers
picks them by the text's length); grouped-query attention; `sliding_window`, when set,
on every layer; tied or separate output head.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from beyondpar.pretrained import layers, llama, rotary
from beyondpar.pretrained.config_fields import field, one_of

MODEL_TYPES = ("phi3",)
ROPE_TYPES = ("default", "longrope")
_LONGROPE_ALIASES = ("su", "yarn")  # older Phi-3 configs' names for longrope


@dataclasses.dataclass(frozen=True)
class Phi3Config:
    vocab_size: int
    max_len: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    eps: float
    rope: rotary.Rope
    window: int | None = None
    activation: str = "silu"
    tied: bool = False

    @classmethod
    def from_hf(cls, c: dict) -> Phi3Config:
        one_of("model_type", c.get("model_type"), MODEL_TYPES)
        embed, heads = field(c, "hidden_size"), field(c, "num_attention_heads")
        kv = field(c, "num_key_value_heads", default=heads)
        if heads % kv:
            raise ValueError(
                f"config.json field 'num_key_value_heads' must divide num_attention_heads={heads}, "
                f"got {kv}"
            )
        head_dim = field(c, "head_dim", default=None)
        if head_dim is None:
            if embed % heads:
                raise ValueError(
                    f"config.json field 'num_attention_heads' must divide hidden_size={embed} "
                    f"when head_dim is not given, got {heads}"
                )
            head_dim = embed // heads
        config = cls(
            vocab_size=field(c, "vocab_size"),
            max_len=field(c, "max_position_embeddings"),
            embed_dim=embed,
            num_layers=field(c, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            mlp_dim=field(c, "intermediate_size"),
            eps=field(c, "rms_norm_eps", float, default=1e-5),
            rope=rotary.Rope.from_params(_rope_parameters(c), c, ROPE_TYPES),
            window=field(c, "sliding_window", default=None),
            activation=one_of("hidden_act", c.get("hidden_act", "silu"), layers.ACTIVATIONS),
            tied=bool(c.get("tie_word_embeddings", False)),
        )
        for length in (1, config.max_len):  # short and long factors counted now, not at run
            config.rope.inverse_frequencies(head_dim, length)
        return config


def _rope_parameters(c: dict) -> dict:
    """`rope_scaling` wins over `rope_parameters` (as transformers reads Phi-3), and the
    older names of longrope ("su", "yarn") are longrope."""
    params = dict(c.get("rope_scaling") or c.get("rope_parameters") or {})
    if params.get("rope_type", params.get("type")) in _LONGROPE_ALIASES:
        params["rope_type"] = "longrope"
    return params


class Phi3Block(nn.Module):
    config: Phi3Config

    @nn.compact
    def __call__(self, x, head_mask=None):
        cfg = self.config
        b, t, _ = x.shape
        d, h_q, h_kv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        h = layers.RMSNorm(cfg.eps, name="input_layernorm")(x)
        qkv = nn.Dense((h_q + 2 * h_kv) * d, use_bias=False, name="qkv_proj")(h)
        q, k, v = jnp.split(qkv, [h_q * d, (h_q + h_kv) * d], axis=-1)
        q, k, v = (y.reshape(b, t, -1, d) for y in (q, k, v))
        inv_freq = cfg.rope.inverse_frequencies(d, t)
        scale = cfg.rope.attention_factor
        q = layers.rotate_half_split(q, inv_freq, scale)
        k = layers.rotate_half_split(k, inv_freq, scale)
        attn = layers.causal_attention(self, q, k, v, d**-0.5, cfg.window, head_mask)
        x = x + nn.Dense(cfg.embed_dim, use_bias=False, name="o_proj")(attn)
        h = layers.RMSNorm(cfg.eps, name="post_attention_layernorm")(x)
        gate_up = nn.Dense(2 * cfg.mlp_dim, use_bias=False, name="gate_up_proj")(h)
        gate, up = jnp.split(gate_up, 2, axis=-1)
        gated = up * layers.ACTIVATIONS[cfg.activation](gate)
        return x + nn.Dense(cfg.embed_dim, use_bias=False, name="down_proj")(gated)


class Phi3(nn.Module):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: Phi3Config
    layer_prefix = "layers"

    def setup(self):
        cfg = self.config
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.embed_dim)
        self.layers = [Phi3Block(cfg) for _ in range(cfg.num_layers)]
        self.norm = layers.RMSNorm(cfg.eps)
        if not cfg.tied:
            self.lm_head = nn.Dense(cfg.vocab_size, use_bias=False)

    def embed(self, tokens_BxT):
        return self.embed_tokens(tokens_BxT)

    def unembed(self, x):
        x = self.norm(x)
        return self.embed_tokens.attend(x) if self.config.tied else self.lm_head(x)

    def __call__(self, tokens_BxT, head_mask=None):
        x = self.embed(tokens_BxT)
        for i, block in enumerate(self.layers):
            x = block(x, None if head_mask is None else head_mask[..., i, :])
        return self.unembed(x)


def block_module(config: Phi3Config, index: int) -> Phi3Block:
    """Layer `index` alone (every layer runs the same code), to go one layer at a time."""
    del index
    return Phi3Block(config)


hf_name = llama.hf_name
out_kernel = llama.out_kernel


def build(config: dict) -> Phi3:
    return Phi3(Phi3Config.from_hf(config))
