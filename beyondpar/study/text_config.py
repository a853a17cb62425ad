"""A language-model run's config (`config_lib.base_text_config`): its checks and its
arithmetic (FLOPs per token, chips' peak rates, expected throughput, memory per device).

Every head count of a size has the same parameters: `model.embed_dim` is fixed and each
of H heads gets embed_dim / H features (`model.ModelConfig.head_dim`), so the sweep over
heads compares models of one size whose heads only partition the same features.
"""

from __future__ import annotations

import ml_collections

from beyondpar import model as model_lib
from beyondpar.base import checks
from beyondpar.study import config_lib

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
SWEEP_HEADS = (1, 2, 4, 8, 16)  # every head count of the study divides each size's d_model

# Dense bfloat16 peak FLOP/s per chip, from the vendors' data sheets, by a word of
# `jax.Device.device_kind`; CPUs have none (no model FLOPs utilisation is logged there).
PEAK_FLOPS = {
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5e": 197e12,
    "TPU v4": 275e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e
}


def is_text(config: ml_collections.ConfigDict) -> bool:
    """Whether `config` is a language-model run (it has a corpus) rather than a task's."""
    return "data" in config


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError for a language-model config that cannot run, before any work."""
    cfg = config_lib.model_config(config)
    o = config.optim
    checks.one_of("compute_dtype", config.compute_dtype, COMPUTE_DTYPES)
    if config.seq_len > cfg.max_len:
        raise ValueError(f"seq_len must be <= model.max_len={cfg.max_len}, got {config.seq_len}")
    for name in ("learning_rate", "clip_norm"):
        checks.positive_number(f"optim.{name}", o[name])
    checks.unit_interval("optim.min_learning_rate_ratio", o.min_learning_rate_ratio)
    counts = {
        "seq_len": config.seq_len,
        "optim.steps": o.steps,
        "optim.batch_size": o.batch_size,
        "optim.microbatches": o.microbatches,
        "eval_every_steps": config.eval_every_steps,
        "log_every_steps": config.log_every_steps,
        "checkpoint_every_steps": config.checkpoint_every_steps,
        "keep_checkpoints": config.keep_checkpoints,
        "evaluation.heldout_windows": config.evaluation.heldout_windows,
        "evaluation.graph_windows": config.evaluation.graph_windows,
        "evaluation.graph_tokens": config.evaluation.graph_tokens,
    }
    for name, value in counts.items():
        checks.positive_int(name, value)
    checks.non_negative_int("optim.warmup_steps", o.warmup_steps)
    if o.batch_size % o.microbatches:
        raise ValueError(
            f"optim.microbatches must divide optim.batch_size={o.batch_size}, got {o.microbatches}"
        )


def check_devices(config: ml_collections.ConfigDict, devices: int) -> None:
    """Each device's share of the batch must split into `optim.microbatches` slices."""
    o = config.optim
    if o.batch_size % (devices * o.microbatches):
        raise ValueError(
            f"optim.batch_size must be divisible by the device count {devices} times "
            f"optim.microbatches={o.microbatches}, got {o.batch_size}"
        )


def non_embedding_params(cfg: model_lib.ModelConfig) -> int:
    """Parameters the per-token matrix products use: the layers and the output head (not
    the token and position embeddings, which are lookups)."""
    d, f = cfg.embed_dim, cfg.mlp_dim
    per_layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * d
    return cfg.num_layers * per_layer + d * cfg.vocab_size + cfg.vocab_size


def flops_per_token(cfg: model_lib.ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward and backward): 6 N for the products with the N
    non-embedding parameters plus 12 L d T for the attention scores and mixes, the count
    of the PaLM paper's appendix B (attention counted over the full T x T)."""
    return 6 * non_embedding_params(cfg) + 12 * cfg.num_layers * cfg.embed_dim * seq_len


def peak_flops(device_kind: str) -> float | None:
    """Dense bfloat16 peak FLOP/s of one chip of `device_kind`; None where unknown (CPUs)."""
    for word, peak in PEAK_FLOPS.items():
        if word.lower() in device_kind.lower():
            return peak
    return None


def expected_tokens_per_second(
    cfg: model_lib.ModelConfig, seq_len: int, peak: float, devices: int, mfu: float = 0.4
) -> float:
    """Tokens per second at model FLOPs utilisation `mfu` of `devices` chips of `peak`."""
    return mfu * peak * devices / flops_per_token(cfg, seq_len)


def memory_per_device_bytes(config: ml_collections.ConfigDict, devices: int, act_bytes: int) -> int:
    """An estimate of one device's training memory: float32 parameters, gradients and
    two AdamW moments (16 bytes a parameter, replicated), plus the activations one
    microbatch keeps for its backward pass at `act_bytes` per element: per layer the
    attention probabilities (b H T^2) and about 12 b T d and 2 b T F stream values,
    then the float32 logits (b T V)."""
    cfg = config_lib.model_config(config)
    b = config.optim.batch_size // (devices * config.optim.microbatches)
    t, d = config.seq_len, cfg.embed_dim
    params = non_embedding_params(cfg) + (cfg.vocab_size + cfg.max_len) * d
    per_layer = b * cfg.num_heads * t * t + 12 * b * t * d + 2 * b * t * cfg.mlp_dim
    activations = act_bytes * cfg.num_layers * per_layer + 4 * b * t * cfg.vocab_size
    return 16 * params + activations
