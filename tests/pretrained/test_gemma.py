"""Gemma 2 and Gemma 3 beyond the parity fixtures: each config field against a closed
form or an equivalent config, checkpoint layouts, and bad values named."""

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from beyondpar import pretrained
from helpers.hf_fixtures import HF, config_of, copy_checkpoint, expected, logits_and_attention


def run(folder, name):
    return logits_and_attention(folder, expected(name)["tokens"])


def test_final_logits_are_cap_tanh_of_the_uncapped_ones(tmp_path):
    """gemma2-tiny caps its logits at 6: the same model without the cap gives z, and the
    fixture's logits are 6 tanh(z / 6), far from z itself."""
    folder = copy_checkpoint("gemma2-tiny", tmp_path, {"final_logit_softcapping": None})
    raw, _ = run(folder, "gemma2-tiny")
    want = expected("gemma2-tiny")["logits"]
    np.testing.assert_allclose(6.0 * np.tanh(np.asarray(raw) / 6.0), want, atol=1e-4)
    assert np.abs(np.asarray(raw) - want).max() > 0.1


def test_attention_cap_changes_the_scores_and_never_the_mask(tmp_path):
    """The fixture's cap of 8 matters (without it attention differs), and capped scores
    are capped before the mask: no weight above the diagonal or outside the window."""
    _, capped = run(HF / "gemma2-tiny", "gemma2-tiny")
    folder = copy_checkpoint("gemma2-tiny", tmp_path, {"attn_logit_softcapping": None})
    _, uncapped = run(folder, "gemma2-tiny")
    assert np.abs(np.asarray(capped) - np.asarray(uncapped)).max() > 1e-2
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    assert np.all(np.asarray(capped)[:, 1][..., j > i] == 0)
    assert np.all(np.asarray(capped)[:, 0][..., (j > i) | (i - j >= 8)] == 0)


@pytest.mark.parametrize(
    "name,sliding,window",
    [
        ("gemma2-tiny", [1, 0], 8),
        ("gemma2-pattern", [1, 0, 1], 5),
        ("gemma3-legacy", [1, 1, 0, 1], 6),
    ],
)
def test_sliding_layers_read_themselves_and_window_minus_one_keys(name, sliding, window):
    """Sliding layers (by `layer_types`, Gemma 2's every other layer, or Gemma 3's
    `sliding_window_pattern`) read exactly the last `window` keys; full layers read all."""
    _, attn = run(HF / name, name)
    attn = np.asarray(attn)
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    for layer, slides in enumerate(sliding):
        outside = (j <= i) & (i - j >= window)
        assert np.all(attn[:, layer][..., outside] == 0) == bool(slides), layer
        if slides:
            assert np.all(attn[:, layer, :, 40, 41 - window : 41] > 0), layer


def test_rope_base_goes_to_its_layer_type(tmp_path):
    """gemma3-tiny: five sliding layers (base 1e4), then a full one (1e6, linear x4).
    A new full-layer base changes the last layer only; a new sliding base the first."""
    rope = config_of("gemma3-tiny")["rope_parameters"]
    _, attn = run(HF / "gemma3-tiny", "gemma3-tiny")
    for kind, changed in [("full_attention", [5]), ("sliding_attention", [0, 1, 2, 3, 4, 5])]:
        other = {**rope, kind: {**rope[kind], "rope_theta": 500.0}}
        sub = tmp_path / kind
        sub.mkdir()
        _, got = run(copy_checkpoint("gemma3-tiny", sub, {"rope_parameters": other}), "gemma3-tiny")
        moved = np.abs(np.asarray(got) - np.asarray(attn)).max(axis=(0, 2, 3, 4)) > 1e-3
        assert list(np.flatnonzero(moved)) == changed, kind


def test_gemma3_old_style_rope_fields_equal_rope_parameters(tmp_path):
    """Before transformers 5: `rope_theta` and `rope_scaling` for full layers and
    `rope_local_base_freq` for sliding ones. gemma3-tiny written that way is the same
    model; gemma3-legacy (written that way) rewritten in the new style too."""
    old = {
        "rope_parameters": None,
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    logits, _ = run(copy_checkpoint("gemma3-tiny", tmp_path, old), "gemma3-tiny")
    np.testing.assert_allclose(logits, expected("gemma3-tiny")["logits"], atol=1e-4)
    new = {
        "rope_theta": None,
        "rope_local_base_freq": None,
        "rope_scaling": None,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.5, "rope_theta": 5e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 2e4},
        },
    }
    (tmp_path / "new").mkdir()
    logits, _ = run(copy_checkpoint("gemma3-legacy", tmp_path / "new", new), "gemma3-legacy")
    np.testing.assert_allclose(logits, expected("gemma3-legacy")["logits"], atol=1e-4)


@pytest.mark.parametrize(
    "change,same",
    [
        ({"sliding_window_pattern": 6}, True),  # the default pattern, spelt out
        ({"_sliding_window_pattern": 2}, True),  # transformers never reads this spelling
        ({"sliding_window_pattern": 2}, False),
    ],
)
def test_gemma3_pattern_without_layer_types(tmp_path, change, same):
    config = {"layer_types": None, "_sliding_window_pattern": None, **change}
    logits, _ = run(copy_checkpoint("gemma3-tiny", tmp_path, config), "gemma3-tiny")
    moved = np.abs(np.asarray(logits) - expected("gemma3-tiny")["logits"]).max()
    assert (moved < 1e-4) == same, moved


def test_embeddings_are_scaled_by_sqrt_hidden_rounded_to_the_weights_dtype():
    """sqrt(32) = 5.6569 becomes 5.65625 in bfloat16, as transformers rounds it."""
    module, params, _ = pretrained.load(HF / "gemma2-tiny", jnp.bfloat16)
    tokens = np.array([[3, 5, 299]])
    got = module.apply({"params": params}, tokens, method="embed")
    table = np.asarray(params["embed_tokens"]["embedding"][tokens[0]], np.float32)
    assert got.dtype == jnp.bfloat16
    want = jnp.asarray(table * 5.65625, jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(got[0], np.float32), np.asarray(want, np.float32))


def test_norm_weights_are_offsets_from_one(tmp_path):
    """Zero norm weights are the identity scale: the same checkpoint with every norm
    weight w stored as 1 + w (a Llama-style reading) is another model."""

    def plus_one(weights):
        return {k: v + 1 if k.endswith("norm.weight") else v for k, v in weights.items()}

    logits, _ = run(copy_checkpoint("gemma3-legacy", tmp_path, tensors=plus_one), "gemma3-legacy")
    assert np.abs(np.asarray(logits) - expected("gemma3-legacy")["logits"]).max() > 1e-2


def test_gemma3_ignores_the_attention_cap_and_its_wrapper_the_final_cap(tmp_path):
    """As transformers: Gemma 3's attention takes no soft-cap, and the multimodal class
    (a `gemma3` config) applies no final soft-cap; a `gemma3_text` model does."""
    folder = copy_checkpoint("gemma3-tiny", tmp_path, {"attn_logit_softcapping": 0.5})
    logits, _ = run(folder, "gemma3-tiny")
    np.testing.assert_allclose(logits, expected("gemma3-tiny")["logits"], atol=1e-4)
    text = {**config_of("gemma3-multimodal")["text_config"], "final_logit_softcapping": 0.5}
    (tmp_path / "wrapped").mkdir()
    wrapped = copy_checkpoint("gemma3-multimodal", tmp_path / "wrapped", {"text_config": text})
    logits, _ = run(wrapped, "gemma3-multimodal")
    np.testing.assert_allclose(logits, expected("gemma3-multimodal")["logits"], atol=1e-4)
    (tmp_path / "text").mkdir()
    capped = copy_checkpoint("gemma3-tiny", tmp_path / "text", {"final_logit_softcapping": 0.5})
    assert np.abs(np.asarray(run(capped, "gemma3-tiny")[0])).max() < 0.5


def test_multimodal_checkpoint_in_either_layout_loads_its_text_model(tmp_path):
    """transformers 5.24 saves a `gemma3` checkpoint as `language_model.model.*` (4.x
    names) beside the vision tower; in memory it names it `model.language_model.*`.
    Both load the same text model; a missing text tensor is named as stored."""
    stored = load_file(HF / "gemma3-multimodal" / "model.safetensors")
    assert any(k.startswith("vision_tower.") for k in stored)

    def renamed(weights):
        out = {}
        for k, v in weights.items():
            k = k.replace("language_model.model.", "model.language_model.")
            out[k.replace("vision_tower.", "model.vision_tower.")] = v
        return out

    folder = copy_checkpoint("gemma3-multimodal", tmp_path, tensors=renamed)
    logits, _ = run(folder, "gemma3-multimodal")
    np.testing.assert_allclose(logits, expected("gemma3-multimodal")["logits"], atol=1e-4)

    def drop(weights):
        return {k: v for k, v in weights.items() if ".layers.1.self_attn.q_proj.bias" not in k}

    (tmp_path / "cut").mkdir()
    cut = copy_checkpoint("gemma3-multimodal", tmp_path / "cut", tensors=drop)
    with pytest.raises(ValueError, match=r"'language_model.model.layers.1.self_attn.q_proj.bias'"):
        pretrained.load(cut)


def test_missing_fields_take_transformers_defaults():
    left_out = ("attn_logit_softcapping", "final_logit_softcapping", "head_dim", "layer_types")
    gemma2 = {k: v for k, v in config_of("gemma2-tiny").items() if k not in left_out}
    cfg = pretrained.build(gemma2).config
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.head_dim) == (50.0, 30.0, 256)
    assert cfg.layer_windows == (8, None)
    wrapped = pretrained.build({"model_type": "gemma3", "text_config": {"num_hidden_layers": 7}})
    cfg = wrapped.config
    assert (cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (262208, 8, 4, 256)
    assert cfg.layer_windows == (4096,) * 5 + (None, 4096)
    assert [r.theta for r in cfg.layer_ropes[4:6]] == [1e4, 1e6]


GEMMA2 = config_of("gemma2-tiny")
GEMMA3 = config_of("gemma3-tiny")


@pytest.mark.parametrize(
    "config,message",
    [
        (
            {**GEMMA2, "query_pre_attn_scalar": 0},
            r"'query_pre_attn_scalar' must be a number > 0, got 0",
        ),
        (
            {**GEMMA2, "attn_logit_softcapping": "8"},
            r"'attn_logit_softcapping' must be a number > 0 or null, got '8'",
        ),
        (
            {**GEMMA2, "final_logit_softcapping": -6.0},
            r"'final_logit_softcapping' must be .*, got -6.0",
        ),
        (
            {**GEMMA2, "layer_types": ["full_attention"]},
            r"'layer_types' must list 2 layers, got \['full_attention'\]",
        ),
        (
            {**GEMMA2, "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
            r"'layer_types' must list 2 layers, got \['sliding_attention', ",
        ),
        (
            {**GEMMA2, "layer_types": ["full_attention", "chunked_attention"]},
            r"'layer_types' must be one of \['full_attention', 'sliding_attention'\], "
            "got 'chunked_attention'",
        ),
        (
            {**GEMMA2, "sliding_window": None},
            r"must set 'sliding_window' for its sliding layers, got null",
        ),
        (
            {**GEMMA2, "hidden_activation": "tanh"},
            r"'hidden_activation' must be one of .*, got 'tanh'",
        ),
        (
            {**GEMMA2, "use_bidirectional_attention": True},
            r"'use_bidirectional_attention' must be false or null",
        ),
        (
            {**GEMMA2, "num_key_value_heads": 3},
            r"'num_key_value_heads' must divide num_attention_heads=4, got 3",
        ),
        (
            {**GEMMA2, "rope_parameters": {"rope_type": "yarn"}},
            r"'rope_type' must be one of \['default', 'linear'\], got 'yarn'",
        ),
        (
            {**GEMMA2, "rope_parameters": GEMMA3["rope_parameters"]},
            r"gemma2 model must be one rope for every layer",
        ),
        (
            {**GEMMA3, "rope_parameters": {"rope_type": "default"}},
            r"'rope_parameters' of a Gemma 3 model must be keyed by layer type",
        ),
        (
            {**GEMMA3, "rope_parameters": {**GEMMA3["rope_parameters"], "rope_theta": 1e4}},
            r"'rope_parameters' of a Gemma 3 model must be keyed by layer type",
        ),
        (
            {**GEMMA3, "rope_parameters": {"full_attention": {"rope_type": "dynamic"}}},
            r"'rope_type' must be one of \['default', 'linear'\], got 'dynamic'",
        ),
        (
            {**GEMMA3, "layer_types": None, "sliding_window_pattern": 0},
            r"'sliding_window_pattern' must be an integer >= 1, got 0",
        ),
        (
            {"model_type": "gemma3", "text_config": [1]},
            r"'text_config' must be an object, got list",
        ),
    ],
)
def test_bad_configs_name_the_field(config, message):
    with pytest.raises(ValueError, match=message):
        pretrained.build(config)


@pytest.mark.parametrize("outer", [True, False, None])
def test_a_gemma3_wrapper_ties_its_head_by_its_own_flag(outer):
    """transformers ties a multimodal Gemma 3's head by the outer config's
    `tie_word_embeddings` (true when absent), whatever its `text_config` says."""
    text = {"num_hidden_layers": 2, "tie_word_embeddings": outer is False}
    config = {"model_type": "gemma3", "text_config": text}
    if outer is not None:
        config["tie_word_embeddings"] = outer
    assert pretrained.build(config).config.tied is (outer is not False)


def test_gemma2_default_rope_turns_every_feature_whatever_the_share_says(tmp_path):
    """Gemma 2's default rope has no partial rotary: a `partial_rotary_factor` of 0.5 at
    the top level and in `rope_parameters` still turns all 16 features of each head (8
    rates 1e4^(-2i/16)), so gemma2-tiny's logits and attention stay the fixture's."""
    rope = {**GEMMA2["rope_parameters"], "partial_rotary_factor": 0.5}
    change = {"partial_rotary_factor": 0.5, "rope_parameters": rope}
    cfg = pretrained.build({**GEMMA2, **change}).config
    want = 1 / 1e4 ** (np.arange(0, 16, 2) / 16)
    for layer_rope in cfg.layer_ropes:
        np.testing.assert_allclose(layer_rope.inverse_frequencies(16), want, rtol=1e-6)
    logits, attn = run(copy_checkpoint("gemma2-tiny", tmp_path, change), "gemma2-tiny")
    np.testing.assert_allclose(logits, expected("gemma2-tiny")["logits"], atol=1e-4)
    np.testing.assert_allclose(attn, expected("gemma2-tiny")["attention"], atol=1e-5)
