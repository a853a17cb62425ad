"""What each tiny Hugging Face fixture under tests/data/hf is: its config, how its random
weights are drawn, and the text and tokenizer every fixture shares.

Data only (no torch, no transformers): `make_hf_fixtures.py` turns a spec into a folder.
A config holds only the fields off transformers' defaults; `edit` changes the config.json
that `save_pretrained` wrote, and `written` replaces it whole, for fixtures whose
config.json holds fields as older checkpoints or other writers lay them out (transformers
would rewrite them on save).
"""

import dataclasses

# The text of every expected.npz. Its first TOKENS ids are row 0 of `tokens`, and the same
# ids reversed are row 1 (a second sequence with other attention patterns).
TEXT = (
    "Multi-head attention lets every head of a layer read the earlier tokens in its own "
    "way; the last token collects what all of them pass on, step after step, layer after "
    "layer, and some heads together carry more than any one of them alone."
)
TOKENS = 64
# The byte-level BPE (300 ids: <|endoftext|>, 256 bytes, 43 merges) is trained on these
# two strings; the same corpus gives the same tokenizer.json, byte for byte.
PANGRAM = "The quick brown fox jumps over the lazy dog."
TOKENIZER_CORPUS = (" ".join([PANGRAM] * 4), TEXT)
VOCAB_SIZE = 300
SPECIAL_TOKEN = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class Init:
    """Random weights, N(mean, std) per kind of tensor. Queries and keys are drawn larger
    than the rest so that attention is peaked (errors in rope, masks or scaling then move
    every probability); norm scales and biases are drawn off 1 and 0 so that a loader that
    drops one is caught. Norm scales are the effective ones: for Gemma's `1 + w` norms the
    stored weight is the scale minus 1."""

    matrix_std: float | None  # None: 1 / sqrt(fan_in)
    embed_std: float  # token and position embeddings, untied heads
    qk_std: float | None  # q and k projections (their rows of fused ones); None: below
    qk_gain: float = 3.0  # with qk_std None: qk_gain / sqrt(fan_in)
    norm: tuple[float, float] = (1.0, 0.2)  # scale of every norm: mean, std
    qk_norm: tuple[float, float] | None = None  # q/k norms (Qwen3, Gemma 3); None: `norm`
    bias_std: float = 0.2  # every bias
    norm_bias: tuple[float, float] | None = None  # LayerNorm biases; None: as biases
    side_std: float = 0.05  # everything beside the text model (a vision tower)


# Small flat weights with sharp queries and keys: the families' fixtures.
FLAT = Init(matrix_std=0.06, embed_std=0.06, qk_std=0.25, norm_bias=(1.0, 0.2))
# The same, sharper: the later families' fixtures (Gemma patterns, Phi-3 longrope).
SHARP = dataclasses.replace(FLAT, qk_std=0.3, norm=(1.0, 0.25))
# Unit embeddings and 1/sqrt(fan_in) matrices: the config variants, whose outputs must
# move far when a field is read another way.
FAN_IN = Init(matrix_std=None, embed_std=1.0, qk_std=None, norm=(1.0, 0.3), bias_std=0.3)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One fixture. `config` is passed to transformers' config class; `edit` sets (value
    None: deletes) fields of the config.json that save_pretrained wrote; `written` is the
    whole config.json, the model built from it. `short` adds `tokens_N`, `logits_N` and
    `attention_N` for each length N (a rope whose scaling depends on the length).
    Expected outputs come from the model loaded in float64; with `upcast`, from the
    float32 model converted by `.double()`, whose buffers (Gemma's embedding scale, rope
    frequencies) keep their float32 rounding: how gemma2-tiny and gemma3-tiny were made,
    which moves their logits by up to 2e-5."""

    init: Init
    config: dict | None = None
    edit: dict | None = None
    written: dict | None = None
    short: tuple[int, ...] = ()
    upcast: bool = False


def llama(**fields) -> dict:
    """The Llama of llama-tiny with `fields` changed or added."""
    base = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-05,
    }
    return {**base, **fields}


def qwen2(**fields) -> dict:
    return llama(architectures=["Qwen2ForCausalLM"], model_type="qwen2", **fields)


def gpt2(**fields) -> dict:
    base = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": VOCAB_SIZE,
        "n_embd": 32,
        "n_head": 4,
        "n_layer": 2,
        "n_positions": 64,
    }
    return {**base, **fields}


def neox(**fields) -> dict:
    base = {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
    }
    return {**base, **fields}


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "rope_theta": 10000.0,
}


GEMMA2_PATTERN = {
    "architectures": ["Gemma2ForCausalLM"],
    "attn_logit_softcapping": 4.0,
    "bos_token_id": 2,
    "dtype": "float32",
    "eos_token_id": 1,
    "final_logit_softcapping": 10.0,
    "head_dim": 12,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 40,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "model_type": "gemma2",
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 12,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 5,
    "tie_word_embeddings": True,
    "vocab_size": VOCAB_SIZE,
}

GEMMA3_LEGACY = {
    "architectures": ["Gemma3ForCausalLM"],
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "dtype": "float32",
    "eos_token_id": 1,
    "final_logit_softcapping": 5.0,
    "head_dim": 16,
    "hidden_activation": "gelu",
    "hidden_size": 24,
    "intermediate_size": 40,
    "max_position_embeddings": 64,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 20,
    "rms_norm_eps": 1e-05,
    "rope_local_base_freq": 20000.0,
    "rope_scaling": {"factor": 2.5, "rope_type": "linear"},
    "rope_theta": 500000.0,
    "sliding_window": 6,
    "sliding_window_pattern": 3,
    "tie_word_embeddings": False,
    "vocab_size": VOCAB_SIZE,
}

GEMMA3_MULTIMODAL = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "dtype": "float32",
    "mm_tokens_per_image": 4,
    "model_type": "gemma3",
    "text_config": {
        "attention_bias": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "final_logit_softcapping": None,
        "head_dim": 24,
        "hidden_size": 32,
        "intermediate_size": 48,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "max_position_embeddings": 64,
        "model_type": "gemma3_text",
        "num_attention_heads": 2,
        "num_hidden_layers": 3,
        "num_key_value_heads": 1,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 2e-06,
        "rope_parameters": {
            "full_attention": {"rope_theta": 200000.0, "rope_type": "default"},
            "sliding_attention": {"factor": 1.5, "rope_theta": 30000.0, "rope_type": "linear"},
        },
        "sliding_window": 4,
        "vocab_size": VOCAB_SIZE,
    },
    "tie_word_embeddings": True,
    "vision_config": {
        "hidden_size": 8,
        "image_size": 16,
        "intermediate_size": 16,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "patch_size": 8,
    },
}

PHI3_LONGROPE = {
    "architectures": ["Phi3ForCausalLM"],
    "bos_token_id": 1,
    "dtype": "float32",
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 48,
    "intermediate_size": 40,
    "max_position_embeddings": 128,
    "model_type": "phi3",
    "num_attention_heads": 6,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "original_max_position_embeddings": 32,
    "pad_token_id": 0,
    "partial_rotary_factor": 0.75,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "long_factor": [1.3, 4.0, 11.0],
        "short_factor": [1.0, 1.7, 2.9],
        "type": "longrope",
    },
    "rope_theta": 5000.0,
    "sliding_window": 12,
    "tie_word_embeddings": True,
    "vocab_size": VOCAB_SIZE,
}

GEMMA2_TINY = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "attn_logit_softcapping": 8.0,
    "final_logit_softcapping": 6.0,
    "query_pre_attn_scalar": 24,
    "sliding_window": 8,
}

GEMMA3_TINY = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "query_pre_attn_scalar": 16,
    "sliding_window": 8,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}

DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# Gemma's norms scale by 1 + w: these two were drawn with w near 1 (scale near 2).
GEMMA_SCALE_2 = dataclasses.replace(FLAT, norm=(2.0, 0.2))

SPECS = {
    "gpt2-tiny": Spec(
        FLAT,
        gpt2(attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=0, eos_token_id=0),
    ),
    "gpt2-untied": Spec(FAN_IN, gpt2(tie_word_embeddings=False)),
    "llama-tiny": Spec(FLAT, llama()),
    "llama3-rope": Spec(
        FLAT,
        llama(
            num_key_value_heads=4,
            tie_word_embeddings=True,
            rope_parameters={
                **LLAMA3_ROPE,
                "rope_theta": 500000.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
    "llama3-smooth": Spec(
        FAN_IN, llama(rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 16})
    ),
    # The top-level field (16) wins over the rope dict's (64) when transformers reads it.
    "llama3-top-original": Spec(
        FAN_IN,
        llama(
            original_max_position_embeddings=16,
            rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 16},
        ),
        edit={"rope_parameters": {**LLAMA3_ROPE, "original_max_position_embeddings": 64}},
    ),
    "llama-partial-rotary": Spec(
        FAN_IN, llama(rope_parameters={**DEFAULT_ROPE, "partial_rotary_factor": 0.5})
    ),
    "llama-layer-types": Spec(
        FAN_IN, llama(layer_types=["full_attention", "sliding_attention"], sliding_window=8)
    ),
    "rope-rates-hd12": Spec(
        FAN_IN, llama(head_dim=12, attention_bias=True, mlp_bias=True, hidden_act="gelu")
    ),
    "mistral-window": Spec(
        FLAT,
        llama(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=8),
    ),
    # transformers' default rotary share for GPT-NeoX is 0.25.
    "neox-tiny": Spec(FLAT, neox()),
    "neox-rotary-default": Spec(
        FAN_IN,
        neox(num_attention_heads=2, layer_norm_eps=0.0001),
        edit={"rope_parameters": DEFAULT_ROPE},  # no share given: a reader assumes 0.25
    ),
    "qwen3-tiny": Spec(
        FLAT,
        llama(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            head_dim=16,
            rms_norm_eps=1e-06,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    "qwen2-tiny": Spec(
        FAN_IN,
        qwen2(
            tie_word_embeddings=True, use_sliding_window=True, sliding_window=8, max_window_layers=1
        ),
    ),
    # As checkpoints written before `max_window_layers` and `layer_types` existed.
    "qwen2-window-layers-default": Spec(
        FAN_IN,
        qwen2(use_sliding_window=True, sliding_window=8),
        edit={"max_window_layers": None, "layer_types": None},
    ),
    "qwen2-yarn": Spec(
        FAN_IN,
        qwen2(
            hidden_size=64,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "beta_fast": 16.0,
            },
        ),
    ),
    "phi3-tiny": Spec(
        FLAT,
        llama(
            architectures=["Phi3ForCausalLM"],
            model_type="phi3",
            eos_token_id=2,
            pad_token_id=0,
            rope_parameters={**DEFAULT_ROPE, "partial_rotary_factor": 0.5},
        ),
    ),
    "phi3-longrope": Spec(SHARP, written=PHI3_LONGROPE, short=(24,)),
    "gemma2-tiny": Spec(GEMMA_SCALE_2, GEMMA2_TINY, upcast=True),
    "gemma2-pattern": Spec(SHARP, written=GEMMA2_PATTERN),
    "gemma3-tiny": Spec(GEMMA_SCALE_2, GEMMA3_TINY, upcast=True),
    "gemma3-legacy": Spec(dataclasses.replace(SHARP, qk_norm=(1.7, 0.3)), written=GEMMA3_LEGACY),
    "gemma3-multimodal": Spec(
        dataclasses.replace(SHARP, qk_norm=(3.0, 0.55)), written=GEMMA3_MULTIMODAL
    ),
}
