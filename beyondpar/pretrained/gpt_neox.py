"""GPT-NeoX (Pythia's architecture, model_type "gpt_neox") as Hugging Face stores it.

One fused `query_key_value` projection laid out per head (q, k, v of head h side by side),
rotary embeddings on the first `partial_rotary_factor` (older configs: `rotary_pct`) of
each head's features, LayerNorms with bias, biases on every projection, parallel
(`use_parallel_residual`) or sequential residual, an untied output head `embed_out`.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn

from beyondpar.pretrained import layers, rotary
from beyondpar.pretrained.config_fields import field, one_of

MODEL_TYPES = ("gpt_neox",)
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclasses.dataclass(frozen=True)
class NeoxConfig:
    vocab_size: int
    max_len: int
    embed_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    eps: float
    rope: rotary.Rope
    activation: str = "gelu"
    parallel_residual: bool = True
    attention_bias: bool = True
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @classmethod
    def from_hf(cls, c: dict) -> NeoxConfig:
        embed, heads = field(c, "hidden_size"), field(c, "num_attention_heads")
        if embed % heads:
            raise ValueError(
                f"config.json field 'num_attention_heads' must divide hidden_size={embed}, "
                f"got {heads}"
            )
        # As transformers 5 reads them: the rope dict's, else the older names, else the
        # defaults (a quarter of each head turns); top-level `rope_theta` and
        # `partial_rotary_factor` are not read.
        legacy = {
            "rope_theta": c.get("rotary_emb_base", 10000.0),
            "partial_rotary_factor": c.get("rotary_pct", 0.25),
        }
        return cls(
            vocab_size=field(c, "vocab_size"),
            max_len=field(c, "max_position_embeddings"),
            embed_dim=embed,
            num_layers=field(c, "num_hidden_layers"),
            num_heads=heads,
            mlp_dim=field(c, "intermediate_size"),
            eps=field(c, "layer_norm_eps", float, default=1e-5),
            rope=rotary.Rope.from_hf({**c, **legacy}, ROPE_TYPES),
            activation=one_of("hidden_act", c.get("hidden_act", "gelu"), layers.ACTIVATIONS),
            parallel_residual=bool(c.get("use_parallel_residual", True)),
            attention_bias=bool(c.get("attention_bias", True)),
            tied=bool(c.get("tie_word_embeddings", False)),
        )


class NeoxBlock(nn.Module):
    config: NeoxConfig

    @nn.compact
    def __call__(self, x, head_mask=None):
        cfg = self.config
        b, t, d = x.shape
        h = nn.LayerNorm(epsilon=cfg.eps, name="input_layernorm")(x)
        qkv = nn.Dense(3 * d, use_bias=cfg.attention_bias, name="query_key_value")(h)
        q, k, v = qkv.reshape(b, t, cfg.num_heads, 3, cfg.head_dim).transpose(3, 0, 1, 2, 4)
        inv_freq = cfg.rope.inverse_frequencies(cfg.head_dim)
        q, k = layers.rotate_half_split(q, inv_freq), layers.rotate_half_split(k, inv_freq)
        attn = layers.causal_attention(self, q, k, v, 1 / math.sqrt(cfg.head_dim), None, head_mask)
        attn = nn.Dense(d, use_bias=cfg.attention_bias, name="dense")(attn)
        mlp = lambda y: nn.Dense(d, name="dense_4h_to_h")(
            layers.ACTIVATIONS[cfg.activation](nn.Dense(cfg.mlp_dim, name="dense_h_to_4h")(y))
        )
        post = nn.LayerNorm(epsilon=cfg.eps, name="post_attention_layernorm")
        if cfg.parallel_residual:
            return x + attn + mlp(post(x))
        x = x + attn
        return x + mlp(post(x))


class GptNeox(nn.Module):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: NeoxConfig
    layer_prefix = "layers"

    def setup(self):
        cfg = self.config
        self.embed_in = nn.Embed(cfg.vocab_size, cfg.embed_dim)
        self.layers = [NeoxBlock(cfg) for _ in range(cfg.num_layers)]
        self.final_layer_norm = nn.LayerNorm(epsilon=cfg.eps)
        if not cfg.tied:  # kept as stored (vocab x hidden) and read by `attend`: no transpose
            self.embed_out = nn.Embed(cfg.vocab_size, cfg.embed_dim)

    def embed(self, tokens_BxT):
        return self.embed_in(tokens_BxT)

    def unembed(self, x):
        x = self.final_layer_norm(x)
        return (self.embed_in if self.config.tied else self.embed_out).attend(x)

    def __call__(self, tokens_BxT, head_mask=None):
        x = self.embed(tokens_BxT)
        for i, block in enumerate(self.layers):
            x = block(x, None if head_mask is None else head_mask[..., i, :])
        return self.unembed(x)


def build(config: dict) -> GptNeox:
    return GptNeox(NeoxConfig.from_hf(config))


def block_module(config: NeoxConfig, index: int) -> NeoxBlock:
    """Layer `index` alone (every layer runs the same code), to go one layer at a time."""
    del index
    return NeoxBlock(config)


_ATTENTION = ("query_key_value", "dense")
_MLP = ("dense_h_to_4h", "dense_4h_to_h")


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """Hugging Face tensor name of a parameter path, and whether it needs a transpose."""
    *mods, param = path
    if mods == ["embed_out"]:
        return "embed_out.weight", False  # an Embed: vocab x hidden, as stored
    leaf = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}[param]
    names = []
    for m in mods:
        if m.startswith("layers_"):
            names.append(f"layers.{m.removeprefix('layers_')}")
        elif m in _ATTENTION:
            names.append(f"attention.{m}")
        elif m in _MLP:
            names.append(f"mlp.{m}")
        else:
            names.append(m)
    return f"gpt_neox.{'.'.join(names)}.{leaf}", param == "kernel"  # Linear is out x in


def out_kernel(params, layer: int):
    """The attention output projection of a layer as a Dense kernel (in x out)."""
    return params[f"layers_{layer}"]["dense"]["kernel"]
