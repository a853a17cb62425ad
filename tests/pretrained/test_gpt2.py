"""GPT-2: checkpoint name layouts, inverse layer scaling, context, score scaling and
activation as transformers reads (or defaults) them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import pretrained
from helpers.hf_fixtures import (
    HF,
    config_of,
    copy_checkpoint,
    copy_without,
    expected,
    logits_and_attention,
)


def test_gpt2_keys_without_prefix_and_mask_buffers(tmp_path):
    """The original `gpt2` checkpoint has no `transformer.` prefix and may hold the causal
    mask buffers `h.N.attn.bias`: same model."""

    def strip(weights):
        out = {k.removeprefix("transformer."): v for k, v in weights.items()}
        out["h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        return out

    folder = copy_checkpoint("gpt2-tiny", tmp_path, tensors=strip)
    logits, attn = logits_and_attention(folder, expected("gpt2-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("gpt2-tiny")["logits"], atol=1e-4)


def test_gpt2_prefix_detected_beside_an_unprefixed_lm_head(tmp_path):
    """GPT2LMHeadModel checkpoints may store `lm_head.weight` without the `transformer.`
    prefix of every other tensor: still the prefixed layout."""

    def add_head(weights):
        return {**weights, "lm_head.weight": weights["transformer.wte.weight"]}

    folder = copy_checkpoint("gpt2-tiny", tmp_path, tensors=add_head)
    logits, _ = logits_and_attention(folder, expected("gpt2-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("gpt2-tiny")["logits"], atol=1e-4)


def test_gpt2_inverse_layer_scaling_divides_each_layers_scores(tmp_path):
    """`scale_attn_by_inverse_layer_idx` divides layer l's scores by l + 1. Layer 0 is
    unchanged, so layer 1 reads the same input as without it and its probabilities are
    softmax(log p / 2) of the unscaled ones p; going one layer at a time must give each
    layer its own divisor, as the whole model does."""
    tokens = expected("gpt2-tiny")["tokens"]
    module, params, _ = pretrained.load(HF / "gpt2-tiny")
    _, plain = pretrained.apply_with_attention(module, params, tokens)
    folder = copy_checkpoint("gpt2-tiny", tmp_path, {"scale_attn_by_inverse_layer_idx": True})
    module, params, _ = pretrained.load(folder)
    logits, attn = pretrained.apply_with_attention(module, params, tokens)
    plain, attn = np.asarray(plain, np.float64), np.asarray(attn)
    np.testing.assert_allclose(attn[:, 0], plain[:, 0], atol=1e-6)
    with np.errstate(divide="ignore"):
        halved = np.exp(np.log(plain[:, 1]) / 2)
    np.testing.assert_allclose(attn[:, 1], halved / halved.sum(-1, keepdims=True), atol=1e-6)
    assert np.abs(attn[:, 1] - plain[:, 1]).max() > 1e-2
    run = pretrained.layer_by_layer(module, params, tokens)
    with pytest.raises(StopIteration) as stop:
        while True:
            layer, got = next(run)
            np.testing.assert_allclose(got, attn[:, layer], atol=1e-6)
    np.testing.assert_allclose(stop.value.value, logits, atol=1e-5)


def test_gpt2_context_is_n_positions_else_n_ctx_else_1024(tmp_path):
    """GPT-2's context (the rows of its learned position table, and the longest text it
    takes) is `n_positions`; older configs name it `n_ctx`, and a config naming neither
    has GPT-2's 1024 positions. A folder whose config gives the context only as `n_ctx`
    loads the fixture's 64-row table and is the fixture's model."""
    name = "gpt2-tiny"
    folder = copy_checkpoint(name, tmp_path, {"n_positions": None, "n_ctx": 64})
    logits, _ = logits_and_attention(folder, expected(name)["tokens"])
    np.testing.assert_allclose(logits, expected(name)["logits"], atol=1e-4)
    config = {k: v for k, v in config_of(name).items() if k != "n_positions"}
    assert pretrained.build({**config, "n_ctx": 40}).config.max_len == 40
    module = pretrained.build(config)
    assert module.config.max_len == 1024
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
    assert shapes["params"]["wpe"]["embedding"].shape == (1024, 32)
    with pytest.raises(ValueError, match="context of 1024 tokens, got 1025"):
        pretrained.apply_with_attention(module, {}, np.zeros((1, 1025), np.int32))


def test_gpt2_scales_scores_by_inverse_sqrt_head_dim_unless_the_config_says_not_to(tmp_path):
    """GPT-2 divides attention scores by sqrt(head_dim) unless `scale_attn_weights` is
    false, and a config that leaves the field out scales (the fixture's model). Unscaled,
    layer 0 (whose input does not depend on it) has probabilities proportional to the
    scaled ones raised to the power sqrt(8), the fixture's head_dim."""
    name = "gpt2-tiny"
    tokens = expected(name)["tokens"]
    logits, _ = logits_and_attention(copy_without(name, tmp_path, "scale_attn_weights"), tokens)
    np.testing.assert_allclose(logits, expected(name)["logits"], atol=1e-4)
    folder = copy_checkpoint(name, tmp_path / "unscaled", {"scale_attn_weights": False})
    _, attn = logits_and_attention(folder, tokens)
    powered = np.asarray(expected(name)["attention"][:, 0], np.float64) ** np.sqrt(8)
    want = powered / powered.sum(-1, keepdims=True)
    np.testing.assert_allclose(attn[:, 0], want, atol=1e-5)
    assert np.abs(want - expected(name)["attention"][:, 0]).max() > 1e-2


def test_gpt2_activation_is_the_tanh_gelu_when_the_config_does_not_say(tmp_path):
    """transformers' GPT-2 defaults `activation_function` to gelu_new (GELU's tanh
    approximation): a config that leaves it out is the fixture's model, the same as one
    naming gelu_new, and not the exact GELU (whose logits here are 7e-5 away)."""
    name = "gpt2-tiny"
    tokens = expected(name)["tokens"]
    logits, _ = logits_and_attention(copy_without(name, tmp_path, "activation_function"), tokens)
    np.testing.assert_allclose(logits, expected(name)["logits"], atol=1e-4)
    runs = {}
    for act in ("gelu_new", "gelu"):
        folder = copy_checkpoint(name, tmp_path / act, {"activation_function": act})
        runs[act] = np.asarray(logits_and_attention(folder, tokens)[0])
    np.testing.assert_allclose(logits, runs["gelu_new"], atol=1e-6)
    assert np.abs(np.asarray(logits) - runs["gelu"]).max() > 3e-5
