"""Phi-3 (model_type "phi3": Phi-3, Phi-3.5, Phi-4-mini) as Hugging Face stores it.

Llama's block with two fused projections: Hugging Face's `qkv_proj` holds the query
rows, then the key rows, then the value rows, and `gate_up_proj` the gate rows, then the
up rows. They are kept fused but read in another row order (`row_order`): `qkv_proj`
grouped by kv head (its query heads, its key head, its value head), `gate_up_proj` with
each gate feature beside its up feature, so that a split of the output features along a
mesh's `model` axis (`sharding`) gives every device whole groups of heads and matching
gate and up features, whatever the number of devices. Rotary on the first
`partial_rotary_factor` of each head; `longrope` scaling (Phi-3-128k, Phi-3.5) takes the
short factors for texts of at most `original_max_position_embeddings` tokens and the
long ones beyond, with its attention factor on cos and sin (as transformers
picks them by the text's length); grouped-query attention; `sliding_window`, when set,
on every layer; tied or separate output head (kept as stored, vocab x hidden).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import numpy as np

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
        group = h_q // h_kv  # query heads per kv head; qkv_proj in `row_order`'s groups
        qkv = nn.Dense((h_q + 2 * h_kv) * d, use_bias=False, name="qkv_proj")(h)
        qkv = qkv.reshape(b, t, h_kv, group + 2, d)
        q = qkv[..., :group, :].reshape(b, t, h_q, d)
        k, v = qkv[..., group, :], qkv[..., group + 1, :]
        inv_freq = cfg.rope.inverse_frequencies(d, t)
        scale = cfg.rope.attention_factor
        q = layers.rotate_half_split(q, inv_freq, scale)
        k = layers.rotate_half_split(k, inv_freq, scale)
        attn = layers.causal_attention(self, q, k, v, d**-0.5, cfg.window, head_mask)
        x = x + nn.Dense(cfg.embed_dim, use_bias=False, name="o_proj")(attn)
        h = layers.RMSNorm(cfg.eps, name="post_attention_layernorm")(x)
        gate_up = nn.Dense(2 * cfg.mlp_dim, use_bias=False, name="gate_up_proj")(h)
        gate_up = gate_up.reshape(b, t, cfg.mlp_dim, 2)  # features side by side: `row_order`
        gate, up = gate_up[..., 0], gate_up[..., 1]
        gated = up * layers.ACTIVATIONS[cfg.activation](gate)
        return x + nn.Dense(cfg.embed_dim, use_bias=False, name="down_proj")(gated)


class Phi3(layers.DecoderStack):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: Phi3Config

    def block(self, index: int) -> Phi3Block:
        del index  # every layer runs the same code
        return Phi3Block(self.config)


def block_module(config: Phi3Config, index: int) -> Phi3Block:
    """Layer `index` alone (every layer runs the same code), to go one layer at a time."""
    del index
    return Phi3Block(config)


hf_name = llama.hf_name
out_kernel = llama.out_kernel


def row_order(path: tuple[str, ...], config: Phi3Config) -> np.ndarray | None:
    """The stored rows of the parameter at `path` in the order the model keeps them, or
    None for as stored: `qkv_proj` by kv head g (query heads g * H/K ... (g + 1) * H/K - 1,
    key head g, value head g), `gate_up_proj` as gate 0, up 0, gate 1, up 1, ..."""
    if path[-1] != "kernel" or path[-2] not in ("qkv_proj", "gate_up_proj"):
        return None
    if path[-2] == "gate_up_proj":
        return np.arange(2 * config.mlp_dim).reshape(2, -1).T.reshape(-1)
    d, h_q, h_kv = config.head_dim, config.num_heads, config.num_kv_heads
    q = np.arange(h_q * d).reshape(h_kv, -1)
    k = h_q * d + np.arange(h_kv * d).reshape(h_kv, d)
    return np.concatenate([q, k, k + h_kv * d], axis=1).reshape(-1)


def build(config: dict) -> Phi3:
    return Phi3(Phi3Config.from_hf(config))


def gguf_config(source) -> dict:
    """The config.json of a phi3 GGUF file (`source`, a GgufFile): its window (0: none),
    and longrope from the rope_factors_long/short tensors with the stored attention
    factor and original context length."""
    config = source.decoder_config()
    config["sliding_window"] = source.arch_value("attention.sliding_window", 0) or None
    config["original_max_position_embeddings"] = source.arch_value(
        "rope.scaling.original_context_length", 4096
    )
    if "rope_factors_long.weight" in source.tensors:
        config["rope_scaling"] = {
            "rope_type": "longrope",
            "long_factor": source.dequantize("rope_factors_long.weight").tolist(),
            "short_factor": source.dequantize("rope_factors_short.weight").tolist(),
            "attention_factor": source.arch_value("rope.scaling.attn_factor", 1.0),
        }
    return config
