"""Llama, Mistral, Qwen2 and Qwen3: grouped and multi-query attention, q/k/v biases,
rope fields, head_dim, sliding windows per layer, q/k norms, partial rotary against
NumPy, and the fields each family ignores or defaults as transformers does."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from beyondpar import pretrained
from helpers.hf_fixtures import (
    HF,
    copy_checkpoint,
    copy_without,
    expected,
    logits_and_attention,
)


def repeat_kv_heads(weights, groups):
    """K/V projections with each kv head repeated for its query heads: the same model
    without grouping (query head h reads kv head h // groups)."""
    out = dict(weights)
    for k, v in weights.items():
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            heads = v.reshape(-1, 8, v.shape[-1])  # head_dim 8
            out[k] = np.repeat(heads, groups, axis=0).reshape(-1, v.shape[-1])
    return out


def test_grouped_query_attention_equals_repeated_kv_heads(tmp_path):
    folder = copy_checkpoint(
        "llama-tiny",
        tmp_path,
        config={"num_key_value_heads": 4},
        tensors=lambda w: repeat_kv_heads(w, 2),
    )
    logits, attn = logits_and_attention(folder)
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)
    np.testing.assert_allclose(attn, expected("llama-tiny")["attention"], atol=1e-5)


def test_multi_query_attention_equals_repeated_kv_head(tmp_path):
    def one_kv_head(weights):
        out = dict(weights)
        for k, v in weights.items():
            if k.endswith(("k_proj.weight", "v_proj.weight")):
                out[k] = v[:8]  # keep kv head 0 only
        return out

    mqa = copy_checkpoint("llama-tiny", tmp_path, {"num_key_value_heads": 1}, one_kv_head)
    (tmp_path / "full").mkdir()
    full = copy_checkpoint(
        "llama-tiny",
        tmp_path / "full",
        {"num_key_value_heads": 4},
        lambda w: repeat_kv_heads(one_kv_head(w), 4),
    )
    a, attn_a = logits_and_attention(mqa)
    b, attn_b = logits_and_attention(full)
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(attn_a, attn_b, atol=1e-6)


def test_qwen2_reads_qkv_biases(tmp_path):
    """Qwen2 is Llama with q/k/v biases: zero biases give Llama's numbers, a value bias
    shifts them, and a missing bias is named."""

    def with_biases(scale):
        def add(weights):
            out = dict(weights)
            for k, v in weights.items():
                if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                    out[k.replace("weight", "bias")] = scale * np.ones(v.shape[0], np.float32)
            return out

        return add

    qwen = {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4}
    zero = copy_checkpoint("llama-tiny", tmp_path, qwen, with_biases(0.0))
    logits, _ = logits_and_attention(zero)
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)
    (tmp_path / "one").mkdir()
    one = copy_checkpoint("llama-tiny", tmp_path / "one", qwen, with_biases(1.0))
    shifted, _ = logits_and_attention(one)
    assert np.abs(np.asarray(shifted) - expected("llama-tiny")["logits"]).max() > 1e-2
    (tmp_path / "none").mkdir()
    missing = copy_checkpoint("llama-tiny", tmp_path / "none", qwen)
    with pytest.raises(
        ValueError, match=r"missing tensors .*'model.layers.0.self_attn.q_proj.bias'.* \(of 6\)"
    ):
        pretrained.load(missing)


def test_rope_theta_at_top_level_and_legacy_rope_scaling(tmp_path):
    config = json.loads((HF / "llama3-rope" / "config.json").read_text())
    legacy = {"rope_theta": 500000.0, "rope_scaling": dict(config["rope_parameters"])}
    del legacy["rope_scaling"]["rope_theta"]
    folder = copy_checkpoint("llama3-rope", tmp_path, {**legacy, "rope_parameters": None})
    logits, _ = logits_and_attention(folder)
    np.testing.assert_allclose(logits, expected("llama3-rope")["logits"], atol=1e-4)
    (tmp_path / "plain").mkdir()
    plain = copy_checkpoint("llama3-rope", tmp_path / "plain", {"rope_parameters": None})
    other, _ = logits_and_attention(plain)  # rope theta 10000, no scaling: another model
    assert np.abs(np.asarray(other) - expected("llama3-rope")["logits"]).max() > 1e-3


def test_explicit_head_dim_sets_projection_shapes(tmp_path):
    rng = np.random.default_rng(0)

    def wider_heads(weights):
        out = dict(weights)
        for k, v in weights.items():
            if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                out[k] = rng.standard_normal((2 * v.shape[0], v.shape[1])).astype(np.float32)
            elif k.endswith("o_proj.weight"):
                out[k] = rng.standard_normal((v.shape[0], 2 * v.shape[1])).astype(np.float32)
        return out

    folder = copy_checkpoint("llama-tiny", tmp_path, {"head_dim": 16}, wider_heads)
    module, params, _ = pretrained.load(folder)
    assert params["layers_0"]["q_proj"]["kernel"].shape == (32, 64)
    _, attn = pretrained.apply_with_attention(module, params, expected("llama-tiny")["tokens"])
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(np.asarray(attn), 1) == 0)


def window_band(t, window):
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j <= i) & (i - j < window)


def test_mistral_window_reads_itself_and_the_keys_before_it():
    _, attn = logits_and_attention(HF / "mistral-window", expected("mistral-window")["tokens"])
    outside = ~window_band(64, 8)
    assert np.all(np.asarray(attn)[..., outside] == 0)
    assert np.all(np.asarray(attn)[..., 20, 13:21] > 0)  # all 8 keys of the window


@pytest.mark.parametrize(
    "config,windowed",
    [
        ({"use_sliding_window": True, "max_window_layers": 1, "layer_types": None}, [0, 1]),
        ({"use_sliding_window": True, "max_window_layers": 0, "layer_types": None}, [1, 1]),
        ({"use_sliding_window": False, "max_window_layers": 0, "layer_types": None}, [0, 0]),
        (
            {"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True},
            [1, 0],
        ),
    ],
)
def test_qwen_windows_follow_layer_types_and_max_window_layers(tmp_path, config, windowed):
    """Qwen2/Qwen3 window the layers `layer_types` names (transformers 5 writes them, and
    they win), else those from `max_window_layers` on when `use_sliding_window`."""
    folder = copy_checkpoint(
        "qwen3-tiny", tmp_path, {**config, "sliding_window": 6, "model_type": "qwen3"}
    )
    _, attn = logits_and_attention(folder, expected("qwen3-tiny")["tokens"])
    outside = ~window_band(64, 6) & np.tril(np.ones((64, 64), bool))
    for layer, want in enumerate(windowed):
        reads_outside = np.asarray(attn)[:, layer][..., outside].max() > 0
        assert reads_outside != bool(want), layer
    if not any(windowed):
        np.testing.assert_allclose(attn, expected("qwen3-tiny")["attention"], atol=1e-5)


def test_qwen3_needs_its_qk_norms(tmp_path):
    def drop_norms(weights):
        return {k: v for k, v in weights.items() if "q_norm" not in k}

    folder = copy_checkpoint("qwen3-tiny", tmp_path, tensors=drop_norms)
    with pytest.raises(ValueError, match=r"missing tensors .*self_attn.q_norm.weight.* \(of 2\)"):
        pretrained.load(folder)


def reference_rotary(x, inv_freq):
    """Rotary on the first 2 * len(inv_freq) features, halves paired (NumPy, float64)."""
    t, rot = x.shape[0], 2 * len(inv_freq)
    angles = np.arange(t)[:, None] * inv_freq[None]
    cos, sin = np.cos(np.tile(angles, 2))[:, None], np.sin(np.tile(angles, 2))[:, None]
    x1, x2 = x[..., : rot // 2], x[..., rot // 2 : rot]
    rotated = x[..., :rot] * cos + np.concatenate([-x2, x1], -1) * sin
    return np.concatenate([rotated, x[..., rot:]], -1)


@pytest.mark.parametrize(
    "factor,where,kind",
    [
        (0.5, "top", "default"),
        (0.25, "rope_parameters", "default"),
        (0.5, "top", "linear"),
        (0.25, "rope_parameters", "linear"),
        (1.0, "top", "linear"),
    ],
)
def test_llama_partial_rotary_matches_a_numpy_reference(tmp_path, factor, where, kind):
    """Layer 0's attention of llama-tiny with `partial_rotary_factor` recomputed in NumPy:
    RMSNorm, q/k projections, rotary on the first factor * head_dim features for a scaled
    rope (linear by 1: the default's rates), on all of them for the default rope, which
    ignores the factor in transformers' Llama."""
    config = json.loads((HF / "llama-tiny" / "config.json").read_text())
    rope = {**config["rope_parameters"], "rope_type": kind, "factor": 1.0}
    change = {"partial_rotary_factor": factor, "rope_parameters": rope}
    if where == "rope_parameters":
        change = {"rope_parameters": {**rope, "partial_rotary_factor": factor}}
    folder = copy_checkpoint("llama-tiny", tmp_path, change)
    # Both sequences (the shape of the file's other llama-tiny runs: a default rope with
    # a share is llama-tiny's own model, one program); the reference is the first's.
    tokens = expected("llama-tiny")["tokens"]
    _, attn = logits_and_attention(folder, tokens)
    w = {k: v.astype(np.float64) for k, v in load_file(folder / "model.safetensors").items()}
    x = w["model.embed_tokens.weight"][tokens[0]]
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + config["rms_norm_eps"])
    h = h * w["model.layers.0.input_layernorm.weight"]
    q = (h @ w["model.layers.0.self_attn.q_proj.weight"].T).reshape(64, 4, 8)
    k = (h @ w["model.layers.0.self_attn.k_proj.weight"].T).reshape(64, 2, 8)
    rot = 8 if kind == "default" else int(8 * factor)
    inv = 1.0 / rope["rope_theta"] ** (np.arange(0, rot, 2) / rot)
    q, k = reference_rotary(q, inv), reference_rotary(k, inv)
    scores = np.einsum("qhd,khd->hqk", q, np.repeat(k, 2, axis=1)) / np.sqrt(8)
    scores = np.where(np.tril(np.ones((64, 64), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(attn[0, 0], probs, atol=2e-5)


def test_qwen_windows_only_when_the_config_asks_for_them():
    """Qwen2/Qwen3's `use_sliding_window` is false when absent (transformers' default): a
    `sliding_window` alone windows no layer."""
    config = {**json.loads((HF / "qwen3-tiny" / "config.json").read_text()), "sliding_window": 6}
    for key in ("layer_types", "use_sliding_window", "max_window_layers"):
        config.pop(key)
    assert pretrained.build(config).config.layer_windows == ()
    asked = {**config, "use_sliding_window": True}
    # transformers' `max_window_layers` is 28 when absent: no layer of two slides.
    assert pretrained.build(asked).config.layer_windows == (None, None)
    from_one = pretrained.build({**asked, "max_window_layers": 1}).config
    assert from_one.layer_windows == (None, 6)
    assert pretrained.build({**asked, "max_window_layers": 0}).config.layer_windows == (6, 6)
    # A `sliding_window` left out is transformers' 4096; written as null, no window.
    del asked["sliding_window"]
    assert pretrained.build({**asked, "max_window_layers": 1}).config.layer_windows == (None, 4096)
    nulled = {**asked, "max_window_layers": 1, "sliding_window": None}
    assert pretrained.build(nulled).config.layer_windows == ()
    # Without `use_sliding_window` Qwen has no window, so a sliding layer is an error (as
    # in transformers, whose mask then finds no window).
    types = {**config, "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]}
    with pytest.raises(ValueError, match="and 'use_sliding_window': true for its sliding layers"):
        pretrained.build(types)
    assert pretrained.build({**types, "use_sliding_window": True}).config.layer_windows == (6, None)


def test_fields_a_family_ignores_or_defaults_as_transformers_does(tmp_path):
    """Mistral has no attention biases whatever `attention_bias` says; GPT-2's head is tied
    when the config does not say; Qwen3's `head_dim` is 128 when left out (not hidden /
    heads); `dynamic` rope scales only past the context, so within it the model is the
    default one."""
    name = "mistral-window"
    folder = copy_checkpoint(name, tmp_path, {"attention_bias": True})
    logits, _ = logits_and_attention(folder, expected(name)["tokens"])
    np.testing.assert_allclose(logits, expected(name)["logits"], atol=1e-4)
    gpt2 = json.loads((HF / "gpt2-tiny" / "config.json").read_text())
    gpt2.pop("tie_word_embeddings", None)
    assert pretrained.build(gpt2).config.tied  # GPT-2's head is its embedding by default
    qwen3 = json.loads((HF / "qwen3-tiny" / "config.json").read_text())
    del qwen3["head_dim"]
    assert pretrained.build(qwen3).config.head_dim == 128
    rope = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}
    folder = copy_checkpoint("llama-tiny", tmp_path / "dynamic", {"rope_parameters": rope})
    logits, _ = logits_and_attention(folder, expected("llama-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)


def test_mlp_biases_are_llamas_and_neox_reads_its_own_rope_names():
    """Only Llama reads `mlp_bias` (Mistral and Qwen build their MLP without biases);
    GPT-NeoX takes its rope dict's share and base, else `rotary_pct` and
    `rotary_emb_base`, never the top-level `partial_rotary_factor` or `rope_theta`; a null
    top-level share counts as absent."""
    llama = json.loads((HF / "llama-tiny" / "config.json").read_text())
    for kind, wanted in (("llama", True), ("mistral", False), ("qwen2", False)):
        assert (
            pretrained.build({**llama, "model_type": kind, "mlp_bias": True}).config.mlp_bias
            is wanted
        )
    neox = {**json.loads((HF / "neox-tiny" / "config.json").read_text()), "rope_parameters": None}
    top = {**neox, "partial_rotary_factor": 0.5, "rope_theta": 7.0}
    assert pretrained.build(top).config.rope.partial_factor == 0.25
    assert pretrained.build(top).config.rope.theta == 10000.0
    old = {**top, "rotary_pct": 0.75, "rotary_emb_base": 3.0}
    assert (
        pretrained.build(old).config.rope.partial_factor,
        pretrained.build(old).config.rope.theta,
    ) == (0.75, 3.0)
    nulled = {**llama, "partial_rotary_factor": None}
    assert pretrained.build(nulled).config.rope.partial_factor == 1.0


def test_attention_bias_gives_each_family_its_own_projection_biases():
    """`attention_bias` biases Llama's and Qwen3's q/k/v and output projections; Qwen2
    has q/k/v biases whatever it says and never an output bias (its o_proj is built
    without one); Mistral has none. The initialised parameters carry exactly those."""
    llama = json.loads((HF / "llama-tiny" / "config.json").read_text())
    wanted = {"llama": (True, True), "qwen3": (True, True), "qwen2": (True, False)}
    wanted["mistral"] = (False, False)
    tokens = jnp.zeros((1, 3), jnp.int32)
    for kind, (qkv, out) in wanted.items():
        model = pretrained.build({**llama, "model_type": kind, "attention_bias": True})
        assert (model.config.qkv_bias, model.config.out_bias) == (qkv, out), kind
        block = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)["params"]["layers_1"]
        assert ("bias" in block["q_proj"], "bias" in block["o_proj"]) == (qkv, out), kind
    qwen2 = pretrained.build({**llama, "model_type": "qwen2", "attention_bias": False}).config
    assert (qwen2.qkv_bias, qwen2.out_bias) == (True, False)


def test_qwen_windows_start_at_layer_28_when_max_window_layers_is_absent_or_null():
    """With `use_sliding_window`, Qwen slides the layers from `max_window_layers` on:
    28 when the config leaves it out or writes null (null counts as absent), so of 30
    layers the last two slide; a given value moves the first sliding layer."""
    config = json.loads((HF / "qwen3-tiny" / "config.json").read_text())
    config = {**config, "num_hidden_layers": 30, "use_sliding_window": True, "sliding_window": 5}
    config.pop("layer_types", None)
    config.pop("max_window_layers", None)
    last_two = (None,) * 28 + (5, 5)
    assert pretrained.build(config).config.layer_windows == last_two
    nulled = {**config, "max_window_layers": None}
    assert pretrained.build(nulled).config.layer_windows == last_two
    from_three = pretrained.build({**config, "max_window_layers": 3}).config
    assert from_three.layer_windows == (None,) * 3 + (5,) * 27
    assert [from_three.window(i) for i in (2, 3, 29)] == [None, 5, 5]


def test_llama_head_is_separate_when_the_config_does_not_say(tmp_path):
    """Llama's `tie_word_embeddings` is false when absent: the checkpoint's own
    `lm_head.weight` gives the logits, not the token embedding."""
    folder = copy_without("llama-tiny", tmp_path, "tie_word_embeddings")
    module, params, _ = pretrained.load(folder)
    assert "lm_head" in params
    logits, _ = pretrained.apply_with_attention(module, params, expected("llama-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)
