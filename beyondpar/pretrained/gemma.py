"""Gemma 2 and Gemma 3 text models (model_type "gemma2", "gemma3_text", and "gemma3"
configs whose `text_config` holds the text model), as transformers defines them.

Embeddings scaled by sqrt(hidden) rounded to the weights' dtype; RMSNorm in float32 as
x * (1 + weight) before and after attention and after the MLP; GeGLU with
`hidden_activation`; `head_dim` independent of hidden / heads; scores scaled by
`query_pre_attn_scalar` ** -0.5; sliding windows by `layer_types` or the family's
pattern (Gemma 2: every other layer, Gemma 3: every `sliding_window_pattern`-th layer is
full). Gemma 2 soft-caps the attention scores (before the mask) and the final logits;
Gemma 3 adds q/k RMSNorm and a rotary base (and scaling) per layer type, and, as in
transformers, ignores `attn_logit_softcapping`; its final soft-cap applies to
`gemma3_text` models, not through a `gemma3` config (transformers' multimodal class has
none). Fields a config leaves out take transformers' defaults.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from beyondpar.pretrained import layers, llama, rotary
from beyondpar.pretrained.config_fields import field, one_of, positive_number

MODEL_TYPES = ("gemma2", "gemma3_text", "gemma3")
ROPE_TYPES = ("default", "linear")
LAYER_TYPES = ("sliding_attention", "full_attention")
_GGUF_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6}  # llama.cpp's: every n-th layer is full
_GGUF_LARGEST_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B models: scaled by hidden / heads
_SHARED_DEFAULTS = dict(
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    query_pre_attn_scalar=256,
    sliding_window=4096,
)
DEFAULTS = {  # transformers' Gemma2Config and Gemma3TextConfig
    "gemma2": dict(
        _SHARED_DEFAULTS,
        vocab_size=256000,
        max_position_embeddings=8192,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
    ),
    "gemma3_text": dict(
        _SHARED_DEFAULTS,
        vocab_size=262208,
        max_position_embeddings=131072,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    ),
}
# A `gemma3` checkpoint stores the text model under one of these (transformers 5, 4.x).
CHECKPOINT_PREFIXES = (
    {},
    {"model.": "model.language_model."},
    {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."},
)


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
    model_type: str
    vocab_size: int
    max_len: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    eps: float
    query_pre_attn_scalar: float
    layer_ropes: tuple[rotary.Rope, ...]
    layer_windows: tuple[int | None, ...]
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qk_norm: bool = False
    attention_bias: bool = False
    activation: str = "gelu_pytorch_tanh"
    tied: bool = True

    @classmethod
    def from_hf(cls, config: dict) -> GemmaConfig:
        kind = one_of("model_type", config.get("model_type"), MODEL_TYPES)
        c = text_config(config)
        gemma2 = kind == "gemma2"
        heads = field(c, "num_attention_heads")
        kv = field(c, "num_key_value_heads")
        if heads % kv:
            raise ValueError(
                f"config.json field 'num_key_value_heads' must divide num_attention_heads={heads}, "
                f"got {kv}"
            )
        if c.get("use_bidirectional_attention"):
            raise ValueError(
                "config.json field 'use_bidirectional_attention' must be false or null (causal "
                "attention), got true"
            )
        num_layers = field(c, "num_hidden_layers")
        types = layer_types(c, num_layers, 2 if gemma2 else None)
        # As transformers: Gemma 3's attention takes no cap, its multimodal class no final one.
        attn_cap = positive_number(c, "attn_logit_softcapping", nullable=True)
        final_cap = positive_number(c, "final_logit_softcapping", nullable=True)
        return cls(
            model_type=kind,
            vocab_size=field(c, "vocab_size"),
            max_len=field(c, "max_position_embeddings"),
            embed_dim=field(c, "hidden_size"),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=field(c, "head_dim"),
            mlp_dim=field(c, "intermediate_size"),
            eps=field(c, "rms_norm_eps", float),
            query_pre_attn_scalar=positive_number(c, "query_pre_attn_scalar"),
            layer_ropes=layer_ropes(c, types, gemma2),
            layer_windows=layer_windows(c, types),
            attn_softcap=attn_cap if gemma2 else None,
            final_softcap=None if kind == "gemma3" else final_cap,
            qk_norm=not gemma2,
            attention_bias=bool(c.get("attention_bias")),
            activation=one_of("hidden_activation", c.get("hidden_activation"), layers.ACTIVATIONS),
            tied=bool((config if kind == "gemma3" else c).get("tie_word_embeddings", True)),
        )


def text_config(config: dict) -> dict:
    """The text model's fields over transformers' defaults: a `gemma3` config's
    `text_config` (its own defaults are Gemma3TextConfig's), else the config itself."""
    kind = config["model_type"]
    if kind == "gemma3":
        inner = config.get("text_config") or {}
        if not isinstance(inner, dict):
            raise ValueError(
                f"config.json field 'text_config' must be an object, got {type(inner).__name__}"
            )
        return {**DEFAULTS["gemma3_text"], **inner}
    return {**DEFAULTS[kind], **config}


def layer_types(c: dict, num_layers: int, pattern: int | None) -> tuple[str, ...]:
    """Each layer's attention type: `layer_types` when listed, else every `pattern`-th
    layer full (Gemma 2: 2; Gemma 3: `sliding_window_pattern`, 6 when absent; transformers
    reads `_sliding_window_pattern` nowhere, so neither does this)."""
    types = c.get("layer_types")
    if types is None:
        pattern = pattern or field(c, "sliding_window_pattern", default=6)
        return tuple(LAYER_TYPES[(i + 1) % pattern == 0] for i in range(num_layers))
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(
            f"config.json field 'layer_types' must list {num_layers} layers, got {types!r}"
        )
    return tuple(one_of("layer_types", t, LAYER_TYPES) for t in types)


def layer_windows(c: dict, types: tuple[str, ...]) -> tuple[int | None, ...]:
    if "sliding_attention" not in types:
        return (None,) * len(types)
    if c.get("sliding_window") is None:
        raise ValueError("config.json must set 'sliding_window' for its sliding layers, got null")
    window = field(c, "sliding_window")
    return tuple(window if t == "sliding_attention" else None for t in types)


def layer_ropes(c: dict, types: tuple[str, ...], gemma2: bool) -> tuple[rotary.Rope, ...]:
    """Gemma 2: one rope for every layer. Gemma 3: one per layer type from
    `rope_parameters` keyed by type, or (older configs) `rope_theta` (default 1e6) and
    `rope_scaling` for full layers and `rope_local_base_freq` (default 1e4) for sliding."""
    if gemma2:
        params = c.get("rope_scaling") or c.get("rope_parameters") or {}
        if set(params) & set(LAYER_TYPES):
            raise ValueError(
                "config.json field 'rope_parameters' of a gemma2 model must be one rope for "
                f"every layer, got one per layer type: {sorted(params)}"
            )
        return (rotary.Rope.from_params(params, c, ROPE_TYPES, default_partial=False),) * len(types)
    by_type = _rope_parameters_by_type(c)
    theta = {"full_attention": c.get("rope_theta") or 1e6}
    theta["sliding_attention"] = c.get("rope_local_base_freq") or 1e4
    ropes = {
        t: rotary.Rope.from_params(
            by_type[t], {}, ROPE_TYPES, theta=theta[t], default_partial=False
        )
        for t in LAYER_TYPES
    }
    return tuple(ropes[t] for t in types)


def _rope_parameters_by_type(c: dict) -> dict[str, dict]:
    given = c.get("rope_parameters")
    if given is not None and not (isinstance(given, dict) and set(given) <= set(LAYER_TYPES)):
        raise ValueError(
            "config.json field 'rope_parameters' of a Gemma 3 model must be keyed by layer "
            f"type {list(LAYER_TYPES)}, got {given!r}"
        )
    by_type = {t: dict((given or {}).get(t) or {"rope_type": "default"}) for t in LAYER_TYPES}
    by_type["full_attention"].update(c.get("rope_scaling") or {})
    return by_type


class GemmaBlock(nn.Module):
    config: GemmaConfig
    layer_index: int = 0

    @nn.compact
    def __call__(self, x, head_mask=None):
        cfg = self.config
        b, t, _ = x.shape
        norm = lambda name: layers.UnitOffsetRMSNorm(cfg.eps, name=name)
        h = norm("input_layernorm")(x)
        heads = lambda n, name: nn.Dense(n * cfg.head_dim, use_bias=cfg.attention_bias, name=name)(
            h
        ).reshape(b, t, n, cfg.head_dim)
        q, k = heads(cfg.num_heads, "q_proj"), heads(cfg.num_kv_heads, "k_proj")
        v = heads(cfg.num_kv_heads, "v_proj")
        if cfg.qk_norm:
            q, k = norm("q_norm")(q), norm("k_norm")(k)
        inv_freq = cfg.layer_ropes[self.layer_index].inverse_frequencies(cfg.head_dim, t)
        q, k = layers.rotate_half_split(q, inv_freq), layers.rotate_half_split(k, inv_freq)
        scale = cfg.query_pre_attn_scalar**-0.5
        window = cfg.layer_windows[self.layer_index]
        attn = layers.causal_attention(self, q, k, v, scale, window, head_mask, cfg.attn_softcap)
        attn = nn.Dense(cfg.embed_dim, use_bias=cfg.attention_bias, name="o_proj")(attn)
        x = x + norm("post_attention_layernorm")(attn)
        h = norm("pre_feedforward_layernorm")(x)
        dense = lambda n, name: nn.Dense(n, use_bias=False, name=name)
        gated = layers.ACTIVATIONS[cfg.activation](dense(cfg.mlp_dim, "gate_proj")(h))
        out = dense(cfg.embed_dim, "down_proj")(gated * dense(cfg.mlp_dim, "up_proj")(h))
        return x + norm("post_feedforward_layernorm")(out)


class Gemma(layers.DecoderStack):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: GemmaConfig

    def block(self, index: int) -> GemmaBlock:
        return GemmaBlock(self.config, index)

    def final_norm(self) -> nn.Module:
        return layers.UnitOffsetRMSNorm(self.config.eps)

    def embed(self, tokens_BxT):
        x = self.embed_tokens(tokens_BxT)
        # sqrt(hidden) as a float32 scalar cast to the weights' dtype, as transformers
        return x * jnp.asarray(np.float32(math.sqrt(self.config.embed_dim))).astype(x.dtype)

    def unembed(self, x):
        return layers.softcap(super().unembed(x), self.config.final_softcap)


def block_module(config: GemmaConfig, index: int) -> GemmaBlock:
    """Layer `index` alone, to go one layer at a time. Its window and rope depend on it,
    and nothing else does: the block of the first layer with the same ones stands for it,
    so that every layer alike runs one compiled program (two for a local/global pattern)."""
    kinds = list(zip(config.layer_ropes, config.layer_windows, strict=True))
    return GemmaBlock(config, kinds.index(kinds[index]))


hf_name = llama.hf_name
out_kernel = llama.out_kernel


def build(config: dict) -> Gemma:
    return Gemma(GemmaConfig.from_hf(config))


def gguf_config(source) -> dict:
    """The config.json of a gemma2 or gemma3 GGUF file (`source`, a GgufFile) as llama.cpp
    runs it: scores scaled by key_length ** -0.5 (by (hidden / heads) ** -0.5 in the 27B
    models: the converter keeps no query_pre_attn_scalar), sliding layers by
    `attention.sliding_window_pattern` or the architecture's pattern, their rope base
    `rope.freq_base_swa`; Gemma 2 soft-caps at 50 and 30 unless the file says otherwise,
    Gemma 3 the final logits if it says."""
    config = source.decoder_config()
    if config["partial_rotary_factor"] != 1:
        raise ValueError(
            f"GGUF file {source.path}: {source.arch}.rope.dimension_count must equal "
            f"{source.arch}.attention.key_length (transformers' Gemma turns every feature), "
            f"got a share of {config['partial_rotary_factor']}"
        )
    gemma2, n = source.arch == "gemma2", config["num_hidden_layers"]
    window = source.arch_value("attention.sliding_window", 4096 if gemma2 else 0)
    largest = n == _GGUF_LARGEST_LAYERS[source.arch]
    full = {"rope_type": "default", **(config.pop("rope_scaling") or {})}
    full["rope_theta"] = config.pop("rope_theta")
    sliding_theta = source.arch_value("rope.freq_base_swa", 10000.0)
    if gemma2:
        if source.arch_value("rope.freq_base_swa", full["rope_theta"]) != full["rope_theta"]:
            raise ValueError(
                f"GGUF file {source.path}: gemma2.rope.freq_base_swa must equal "
                f"rope.freq_base={full['rope_theta']}, got {sliding_theta}"
            )
        rope = full
    else:
        rope = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": sliding_theta},
        }
    final = source.arch_value("final_logit_softcapping", 30.0 if gemma2 else 0.0)
    return {
        **config,
        "model_type": "gemma2" if gemma2 else "gemma3_text",
        "query_pre_attn_scalar": config["hidden_size"] // config["num_attention_heads"]
        if largest
        else config["head_dim"],
        "layer_types": _gguf_layer_types(source, n) if window else ["full_attention"] * n,
        "sliding_window": window or None,
        "rope_parameters": rope,
        "attn_logit_softcapping": source.arch_value("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": final or None,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _gguf_layer_types(source, num_layers: int) -> list[str]:
    """llama.cpp's sliding layers: one flag per layer, or a pattern n (layer i slides
    when i % n < n - 1; 0: every layer slides)."""
    default = _GGUF_SLIDING_PATTERN[source.arch]
    pattern = source.arch_value("attention.sliding_window_pattern", default)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(
                f"GGUF file {source.path}: {source.arch}.attention.sliding_window_pattern must "
                f"flag {num_layers} layers, got {len(pattern)}"
            )
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(num_layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]
