"""Phi-3 beyond the parity fixtures: the fused projections against Llama's separate ones,
longrope at both lengths, older config names, and bad values named."""

import json

import jax
import numpy as np
import pytest

from beyondpar import pretrained
from helpers.hf_fixtures import HF, config_of, copy_checkpoint, expected, logits_and_attention


def as_llama(weights: dict, config: dict) -> dict:
    """Phi-3 tensors split into Llama's: q, k, v rows in that order; gate, then up."""
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config["hidden_size"] // heads
    out = {}
    for name, w in weights.items():
        if name.endswith("qkv_proj.weight"):
            q, k, v = np.split(w, [heads * d, (heads + kv) * d])
            for part, rows in zip(("q", "k", "v"), (q, k, v), strict=True):
                out[name.replace("qkv_proj", f"{part}_proj")] = rows
        elif name.endswith("gate_up_proj.weight"):
            gate, up = np.split(w, 2)
            out[name.replace("gate_up_proj", "gate_proj")] = gate
            out[name.replace("gate_up_proj", "up_proj")] = up
        else:
            out[name] = w
    return out


@pytest.mark.parametrize("name", ["phi3-tiny", "phi3-longrope"])
def test_fused_projections_equal_llama_with_split_ones(tmp_path, name):
    """Split as Phi-3 lays them out, the same weights run as a Llama (a Mistral for the
    window) give the same logits: a wrong q/k/v or gate/up order would not. Llama has no
    longrope: at 64 tokens its long factors are Llama's frequency divisors, with
    longrope's attention factor set to 1 on the Phi-3 side."""
    config = config_of(name)
    llama = {"model_type": "mistral" if config.get("sliding_window") else "llama"}
    # Llama's default rope turns every feature; a scaled one (linear by 1) reads the share.
    rope = config.get("rope_scaling") or config["rope_parameters"]
    share = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    llama["rope_scaling"] = {"rope_type": "linear", "factor": 1.0, "partial_rotary_factor": share}
    phi = HF / name
    if name == "phi3-longrope":
        rope = {**config["rope_scaling"], "attention_factor": 1.0}
        phi = copy_checkpoint(name, tmp_path / "phi", {"rope_scaling": rope})
        llama.update(rope_freq_factors=rope["long_factor"])
    folder = copy_checkpoint(name, tmp_path / "llama", llama, lambda w: as_llama(w, config))
    module, params, _ = pretrained.load(folder)
    assert type(module).__name__ == "Llama"
    tokens = expected(name)["tokens"]
    got, attn = pretrained.apply_with_attention(module, params, tokens)
    want, want_attn = logits_and_attention(phi, tokens)
    # Two float32 orders of the same sums: phi3-longrope's attention is 8.6e-6 from its
    # float64 one (phi3-tiny's 7e-7), so the two layouts may differ by twice that.
    atol = 5e-5 if name == "phi3-longrope" else 1e-6
    np.testing.assert_allclose(got, want, atol=max(atol, 1e-5))
    np.testing.assert_allclose(attn, want_attn, atol=atol)


def test_longrope_short_factors_for_texts_within_the_original_length():
    """phi3-longrope's original length is 32: its 24-token expected outputs come from the
    short factors, the 64-token ones (the parity test) from the long ones."""
    exp = expected("phi3-longrope")
    module, params, _ = pretrained.load(HF / "phi3-longrope")
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens_24"])
    np.testing.assert_allclose(logits, exp["logits_24"], atol=1e-4)
    np.testing.assert_allclose(attn, exp["attention_24"], atol=1e-5)


@pytest.mark.parametrize(
    "change",
    [
        {"type": "su"},  # Phi-3's older names of longrope
        {"type": "yarn"},
    ],
)
def test_older_longrope_names(tmp_path, change):
    rope = {**config_of("phi3-longrope")["rope_scaling"], **change}
    folder = copy_checkpoint("phi3-longrope", tmp_path, {"rope_scaling": rope})
    logits, _ = logits_and_attention(folder, expected("phi3-longrope")["tokens"])
    np.testing.assert_allclose(logits, expected("phi3-longrope")["logits"], atol=1e-4)


def test_window_on_every_layer():
    _, attn = logits_and_attention(HF / "phi3-longrope", expected("phi3-longrope")["tokens"])
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    attn = np.asarray(attn)
    assert np.all(attn[..., (j > i) | (i - j >= 12)] == 0)
    assert np.all(attn[:, :, :, 50, 39:51] > 0)


PHI3 = config_of("phi3-longrope")


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"rope_scaling": {**PHI3["rope_scaling"], "long_factor": [1.0, 2.0]}},
            r"'long_factor' must number 3 \(rotary dim / 2\), got 2",
        ),
        (
            {"rope_scaling": {**PHI3["rope_scaling"], "short_factor": None}},
            r"'short_factor' must be a list of positive numbers, got None",
        ),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            r"'rope_type' must be one of \['default', 'longrope'\], got 'dynamic'",
        ),
        (
            {"partial_rotary_factor": 0},
            r"'partial_rotary_factor' must be a number in \(0, 1\], got 0",
        ),
        (
            {"num_key_value_heads": 4},
            r"'num_key_value_heads' must divide num_attention_heads=6, got 4",
        ),
        ({"sliding_window": 0}, r"'sliding_window' must be an integer >= 1, got 0"),
        ({"hidden_act": "swiglu"}, r"'hidden_act' must be one of .*, got 'swiglu'"),
    ],
)
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        pretrained.build({**PHI3, **change})


def test_a_missing_norm_epsilon_is_transformers_default():
    """Phi3Config's rms_norm_eps defaults to 1e-5 (Llama's to 1e-6)."""
    config = {k: v for k, v in config_of("phi3-tiny").items() if k != "rms_norm_eps"}
    assert pretrained.build(config).config.eps == 1e-5
    llama = {**config, "model_type": "llama", "rope_parameters": None}
    assert pretrained.build(llama).config.eps == 1e-6


def test_head_is_separate_when_the_config_does_not_say(tmp_path):
    """Phi3Config's `tie_word_embeddings` is false when absent: the checkpoint's own
    `lm_head.weight` gives the logits, not the token embedding."""
    folder = copy_checkpoint("phi3-tiny", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    module, params, _ = pretrained.load(folder)
    assert not module.config.tied and "lm_head" in params
    tokens = expected("phi3-tiny")["tokens"]
    logits, _ = pretrained.apply_with_attention(module, params, tokens)
    np.testing.assert_allclose(logits, expected("phi3-tiny")["logits"], atol=1e-4)


def test_a_missing_kv_head_count_means_one_kv_head_per_query_head():
    """Phi3Config's `num_key_value_heads` defaults to `num_attention_heads` (plain
    multi-head attention): phi3-tiny without the field (4 heads of 8 features, hidden 32)
    has a fused qkv projection of 4 + 2 * 4 heads, 96 output features, not the 48 of its
    stored 2 kv heads."""
    config = {k: v for k, v in config_of("phi3-tiny").items() if k != "num_key_value_heads"}
    module = pretrained.build(config)
    assert (module.config.num_heads, module.config.num_kv_heads) == (4, 4)
    variables = jax.eval_shape(module.init, jax.random.key(0), np.zeros((1, 5), np.int32))
    kernel = variables["params"]["layers_0"]["qkv_proj"]["kernel"]
    assert kernel.shape == (32, 96)


def test_an_explicit_head_dim_wins_over_hidden_over_heads():
    """A `head_dim` of 16 (hidden 32 over 4 heads would give 8) sets every head's width:
    the fused qkv projection has (4 + 2 * 2) * 16 = 128 outputs, the output projection
    64 inputs, and half of each head (8 features, 4 rates) rotates."""
    module = pretrained.build({**config_of("phi3-tiny"), "head_dim": 16})
    assert module.config.head_dim == 16
    variables = jax.eval_shape(module.init, jax.random.key(0), np.zeros((1, 5), np.int32))
    layer = variables["params"]["layers_0"]
    assert layer["qkv_proj"]["kernel"].shape == (32, 128)
    assert layer["o_proj"]["kernel"].shape == (64, 32)
    want = 1 / 1e4 ** (np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(module.config.rope.inverse_frequencies(16), want, rtol=1e-6)
