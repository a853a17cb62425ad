"""Hugging Face checkpoints in JAX: parity with transformers, layouts, cache, bad input."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from beyondpar import pretrained
from helpers.hf_fixtures import (
    CONFIG_VARIANTS,
    HF,
    config_of,
    copy_checkpoint,
    expected,
    logits_and_attention,
)

FAMILIES = (
    "gpt2-tiny",
    "llama-tiny",
    "llama3-rope",
    "neox-tiny",
    "qwen3-tiny",
    "mistral-window",
    "gemma2-tiny",
    "gemma3-tiny",
    "phi3-tiny",
    "gemma2-pattern",
    "gemma3-legacy",
    "gemma3-multimodal",
    "phi3-longrope",
)

# Six layers of peaked attention: transformers' own float32 forward is 1.6e-5 away from
# this fixture's float64 attention (its float64 forward 7.5e-6), so float32 gets 2e-5.
# Phi-3's long rope factors rotate by large angles, where float32 sine and cosine differ
# between CPUs: 2 of 147,456 probabilities 1.4e-5 away on one (AMD EPYC), under 1e-5 on
# another.
ATTENTION_ATOL = {"gemma3-tiny": 2e-5, "phi3-longrope": 2e-5}


@pytest.mark.parametrize("name", FAMILIES)
def test_parity_with_transformers(name):
    exp = expected(name)
    module, params, tokenizer = pretrained.load(HF / name)
    ids = tokenizer.encode(str(exp["text"])).ids
    np.testing.assert_array_equal(ids[: exp["tokens"].shape[1]], exp["tokens"][0])
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens"])
    assert attn.dtype == jnp.float32 and attn.shape == exp["attention"].shape
    np.testing.assert_allclose(logits, exp["logits"], atol=1e-4)
    np.testing.assert_allclose(attn, exp["attention"], atol=ATTENTION_ATOL.get(name, 1e-5))


@pytest.mark.float64
@pytest.mark.parametrize("name", CONFIG_VARIANTS)
def test_config_fields_are_read_as_transformers_reads_them(name):
    """Fixtures whose config.json holds a field as real checkpoints write it, where
    reading it another way changes every output (see `hf_fixtures.CONFIG_VARIANTS`). In
    float64, so that what is compared is the model each config describes."""
    exp = expected(name)
    module, params, _ = pretrained.load(HF / name, jnp.float64)
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens"])
    np.testing.assert_allclose(logits, exp["logits"], atol=1e-4)
    np.testing.assert_allclose(attn, exp["attention"], atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_by_layer_equals_the_whole_forward(name):
    exp = expected(name)
    module, params, _ = pretrained.load(HF / name)
    layers = pretrained.layer_by_layer(module, params, exp["tokens"][:1])
    got = []
    with pytest.raises(StopIteration) as stop:
        while True:
            got.append(next(layers))
    assert [i for i, _ in got] == list(range(module.config.num_layers))
    atol = ATTENTION_ATOL.get(name, 1e-5)
    np.testing.assert_allclose(np.stack([a for _, a in got], 1), exp["attention"][:1], atol=atol)
    np.testing.assert_allclose(stop.value.value, exp["logits"][:1], atol=1e-4)


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


def test_sharded_checkpoint_equals_single_file(tmp_path):
    folder = copy_checkpoint("llama-tiny", tmp_path)
    weights = load_file(folder / "model.safetensors")
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, folder / file)
    index = {"weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors").unlink()
    logits, _ = logits_and_attention(folder)
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"absent: \['model-00002-of-00002.safetensors'\]"):
        pretrained.load(folder)


def test_model_name_resolves_in_the_local_cache(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--tiny-org--llama"
    snapshot = repo / "snapshots" / "abc123"
    shutil.copytree(HF / "llama-tiny", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    module, _, _ = pretrained.load("tiny-org/llama")
    assert module.config.num_kv_heads == 2
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(
        FileNotFoundError, match=r"nor in the local .*elsewhere/models--tiny-org--llama/refs/main"
    ):
        pretrained.load("tiny-org/llama")


def test_bf16_stays_bf16_and_attention_is_float32(tmp_path):
    def to_bf16(weights):
        return {k: v.astype(jnp.bfloat16) for k, v in weights.items()}

    folder = copy_checkpoint("llama-tiny", tmp_path, tensors=to_bf16)
    module, params, _ = pretrained.load(folder)
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    logits, attn = pretrained.apply_with_attention(module, params, expected("llama-tiny")["tokens"])
    assert attn.dtype == jnp.float32 and logits.dtype == jnp.bfloat16
    np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-6)
    assert np.abs(np.asarray(attn) - expected("llama-tiny")["attention"]).max() < 0.1
    _, params32, _ = pretrained.load(folder, jnp.float32)
    assert {p.dtype for p in jax.tree.leaves(params32)} == {jnp.dtype(jnp.float32)}


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


@pytest.mark.parametrize(
    "config,message",
    [
        ({"model_type": "bert"}, r"'model_type' must be one of .*, got 'bert'"),
        (
            {"rope_parameters": {"rope_type": "yarm", "rope_theta": 1e4}},
            r"'rope_type' must be one of \['default', 'dynamic', 'linear', 'llama3', 'yarn'\], "
            "got 'yarm'",
        ),
        ({"num_key_value_heads": 3}, "'num_key_value_heads' must divide num_attention_heads=4"),
        ({"hidden_act": "tanh"}, r"'hidden_act' must be one of .*, got 'tanh'"),
    ],
)
def test_bad_configs_name_the_field(config, message, tmp_path):
    folder = copy_checkpoint("llama-tiny", tmp_path, config)
    with pytest.raises(ValueError, match=message):
        pretrained.load(folder)


def test_bad_folders_name_what_is_missing(tmp_path):
    for missing, message in [
        ("config.json", "must hold config.json, got none"),
        ("tokenizer.json", "must hold tokenizer.json, got none"),
        ("model.safetensors", "must hold model.safetensors or model.safetensors.index.json"),
    ]:
        folder = copy_checkpoint("gpt2-tiny", tmp_path / missing.split(".")[0])
        (folder / missing).unlink()
        with pytest.raises(FileNotFoundError, match=message):
            pretrained.load(folder)
    with pytest.raises(
        FileNotFoundError, match="must be a checkpoint folder, a GGUF file or a model name"
    ):
        pretrained.load(tmp_path / "no" / "such" / "folder")


def test_missing_tokenizer_is_a_value_error_and_a_file_not_found_error(tmp_path):
    folder = copy_checkpoint("gpt2-tiny", tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="must hold tokenizer.json, got none") as raised:
        pretrained.load(folder)
    assert isinstance(raised.value, FileNotFoundError)


def test_wrong_tensor_shape_is_named(tmp_path):
    def shrink(weights):
        weights["transformer.h.1.mlp.c_fc.weight"] = weights["transformer.h.1.mlp.c_fc.weight"][
            :, :64
        ]
        return weights

    folder = copy_checkpoint("gpt2-tiny", tmp_path, tensors=shrink)
    with pytest.raises(
        ValueError,
        match=r"'transformer.h.1.mlp.c_fc.weight' must have shape \(32, 128\), got \(32, 64\)",
    ):
        pretrained.load(folder)


def test_texts_longer_than_the_context_are_errors():
    module, params, _ = pretrained.load(HF / "gpt2-tiny")
    with pytest.raises(ValueError, match="at most the model's context of 64 tokens, got 65"):
        pretrained.apply_with_attention(module, params, np.zeros((1, 65), int))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 300\), got \[0, 300\]"):
        pretrained.apply_with_attention(module, params, np.array([[0, 300]]))


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
    tokens = expected("llama-tiny")["tokens"][:1]
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


def test_neox_legacy_rotary_fields_and_sequential_residual(tmp_path):
    """Before transformers 5 GPT-NeoX configs named the rotary share `rotary_pct` and the
    base `rotary_emb_base`: same model. Sequential residual differs from parallel, and
    equals it when the attention output is zero (then both add only the MLP of ln2(x))."""
    legacy = {"rope_parameters": None, "rotary_pct": 0.25, "rotary_emb_base": 10000.0}
    folder = copy_checkpoint("neox-tiny", tmp_path, legacy)
    tokens = expected("neox-tiny")["tokens"]
    logits, _ = logits_and_attention(folder, tokens)
    np.testing.assert_allclose(logits, expected("neox-tiny")["logits"], atol=1e-4)

    def silence_attention(weights):
        return {k: (0 * v if ".attention.dense." in k else v) for k, v in weights.items()}

    runs = {}
    for parallel in (True, False):
        for silent in (True, False):
            sub = tmp_path / f"{parallel}-{silent}"
            sub.mkdir()
            change = {"use_parallel_residual": parallel}
            f = copy_checkpoint("neox-tiny", sub, change, silence_attention if silent else None)
            runs[parallel, silent] = np.asarray(logits_and_attention(f, tokens)[0])
    np.testing.assert_allclose(runs[True, True], runs[False, True], atol=1e-6)
    assert np.abs(runs[True, False] - runs[False, False]).max() > 1e-2


@pytest.mark.parametrize("name", ["gpt2-tiny", "neox-tiny", "qwen3-tiny"])
def test_head_mask_of_ones_is_the_model_and_zero_removes_the_head(tmp_path, name):
    """All ones: the same logits to the bit. A zero for head h of layer 0 equals zeroing
    the output projection's input features of that head in the checkpoint."""
    module, params, _ = pretrained.load(HF / name)
    tokens = expected(name)["tokens"]
    cfg = module.config
    plain, attn = pretrained.apply_with_attention(module, params, tokens)
    ones = np.ones((cfg.num_layers, cfg.num_heads))
    masked, attn_ones = pretrained.apply_with_attention(module, params, tokens, ones)
    np.testing.assert_array_equal(plain, masked)
    mask = ones.copy()
    mask[0, 1] = 0
    got, _ = pretrained.apply_with_attention(module, params, tokens, mask)
    fam = pretrained.family(module)
    kernel = np.array(fam.out_kernel(params, 0))
    d = kernel.shape[0] // cfg.num_heads
    kernel[d : 2 * d] = 0
    edited = jax.tree.map(lambda x: x, params)
    layer = pretrained.layer_name(module, 0)
    out_name = {"gpt2-tiny": "c_proj", "neox-tiny": "dense", "qwen3-tiny": "o_proj"}[name]
    edited[layer] = {**params[layer], out_name: {**params[layer][out_name], "kernel": kernel}}
    want, _ = pretrained.apply_with_attention(module, edited, tokens)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(np.asarray(got) - np.asarray(plain)).max() > 1e-3
    per_sequence = np.stack([ones, mask])
    both, _ = pretrained.apply_with_attention(module, params, tokens, per_sequence)
    np.testing.assert_allclose(both[0], plain[0], atol=1e-6)
    np.testing.assert_allclose(both[1], want[1], atol=1e-5)
    layers = pretrained.layer_by_layer(module, params, tokens, mask)
    with pytest.raises(StopIteration) as stop:
        while True:
            next(layers)
    np.testing.assert_allclose(stop.value.value, want, atol=1e-5)


def test_bad_head_masks_are_named():
    module, params, _ = pretrained.load(HF / "llama-tiny")
    tokens = expected("llama-tiny")["tokens"]
    with pytest.raises(ValueError, match=r"head_mask must have shape \(L, H\) = \(2, 4\)"):
        pretrained.apply_with_attention(module, params, tokens, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"head_mask entries must be in \[0, 1\], got range"):
        pretrained.apply_with_attention(module, params, tokens, 2 * np.ones((2, 4)))


@pytest.mark.parametrize(
    "name,field",
    [
        ("gpt2-tiny", "layer_norm_epsilon"),
        ("llama-tiny", "rms_norm_eps"),
        ("neox-tiny", "layer_norm_eps"),
        ("qwen3-tiny", "rms_norm_eps"),
    ],
)
def test_norm_epsilon_is_read_from_config(tmp_path, name, field):
    """A large epsilon changes every norm's output: the config's value must reach the
    module (the fixtures use the defaults, which a misspelt field would fall back to)."""
    folder = copy_checkpoint(name, tmp_path, {field: 0.5})
    module, params, _ = pretrained.load(folder)
    assert module.config.eps == 0.5
    logits, _ = pretrained.apply_with_attention(module, params, expected(name)["tokens"])
    assert np.abs(np.asarray(logits) - expected(name)["logits"]).max() > 1e-3


def test_gpt2_prefix_detected_beside_an_unprefixed_lm_head(tmp_path):
    """GPT2LMHeadModel checkpoints may store `lm_head.weight` without the `transformer.`
    prefix of every other tensor: still the prefixed layout."""

    def add_head(weights):
        return {**weights, "lm_head.weight": weights["transformer.wte.weight"]}

    folder = copy_checkpoint("gpt2-tiny", tmp_path, tensors=add_head)
    logits, _ = logits_and_attention(folder, expected("gpt2-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("gpt2-tiny")["logits"], atol=1e-4)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]), "weights file"),
        (lambda f: f.write_bytes(b"\x00" * 16), "weights file"),
    ],
)
def test_damaged_weights_file_is_one_error_naming_it(tmp_path, damage, message):
    folder = copy_checkpoint("llama-tiny", tmp_path)
    damage(folder / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{message} {folder / 'model.safetensors'}"):
        pretrained.load(folder)


def test_damaged_index_and_tokenizer_files_are_named(tmp_path):
    folder = copy_checkpoint("llama-tiny", tmp_path)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(ValueError, match="model.safetensors.index.json is not valid JSON"):
        pretrained.load(folder)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match="must map tensor names to files under 'weight_map'"):
        pretrained.load(folder)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "tokenizer.json").write_text("not json")
    with pytest.raises(ValueError, match="tokenizer.json is not a valid tokenizer file"):
        pretrained.load(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object, got list"):
        pretrained.load(folder)


def test_layer_by_layer_gives_each_layer_its_own_window(tmp_path):
    """Layer 0 full, layer 1 a 4-token window (`layer_types`): going one layer at a time
    must build each layer with its own window, as the whole model does."""
    folder = tmp_path / "windowed"
    shutil.copytree(HF / "llama-tiny", folder)
    config = json.loads((folder / "config.json").read_text())
    # Mistral: Llama itself has no window, whatever `layer_types` says.
    config.update(
        model_type="mistral", layer_types=["full_attention", "sliding_attention"], sliding_window=4
    )
    (folder / "config.json").write_text(json.dumps(config))
    module, params, _ = pretrained.load(folder)
    tokens = np.arange(1, 17)[None] % module.config.vocab_size
    _, whole = pretrained.apply_with_attention(module, params, tokens)
    run = pretrained.layer_by_layer(module, params, tokens)
    i, j = np.indices((16, 16))
    for layer, attn in run:
        np.testing.assert_allclose(attn, whole[:, layer], atol=1e-6)
        beyond = np.asarray(attn)[..., i - j >= 4]
        assert (beyond > 0).any() if layer == 0 else not beyond.any(), layer


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


def copy_without(name, tmp_path, key):
    """A copy of a fixture folder whose config.json leaves `key` out."""
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    config = json.loads((folder / "config.json").read_text())
    del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


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


def test_neox_residual_is_parallel_when_the_config_does_not_say(tmp_path):
    """transformers' GPT-NeoX defaults `use_parallel_residual` to true: a config that
    leaves it out is the parallel model of the fixture (sequential differs by > 1e-2)."""
    folder = copy_without("neox-tiny", tmp_path, "use_parallel_residual")
    logits, _ = logits_and_attention(folder, expected("neox-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("neox-tiny")["logits"], atol=1e-4)


def test_llama_head_is_separate_when_the_config_does_not_say(tmp_path):
    """Llama's `tie_word_embeddings` is false when absent: the checkpoint's own
    `lm_head.weight` gives the logits, not the token embedding."""
    folder = copy_without("llama-tiny", tmp_path, "tie_word_embeddings")
    module, params, _ = pretrained.load(folder)
    assert "lm_head" in params
    logits, _ = pretrained.apply_with_attention(module, params, expected("llama-tiny")["tokens"])
    np.testing.assert_allclose(logits, expected("llama-tiny")["logits"], atol=1e-4)


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


def test_neox_projections_have_biases_when_the_config_does_not_say(tmp_path):
    """transformers' GPT-NeoX defaults `attention_bias` to true: a config that leaves it
    out reads the checkpoint's query_key_value and dense biases and is the fixture's
    model; false builds both projections without them."""
    name = "neox-tiny"
    folder = copy_without(name, tmp_path, "attention_bias")
    module, params, _ = pretrained.load(folder)
    assert "bias" in params["layers_0"]["query_key_value"]
    assert "bias" in params["layers_1"]["dense"]
    logits, _ = pretrained.apply_with_attention(module, params, expected(name)["tokens"])
    np.testing.assert_allclose(logits, expected(name)["logits"], atol=1e-4)
    off = pretrained.build({**config_of(name), "attention_bias": False})
    shapes = jax.eval_shape(off.init, jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
    block = shapes["params"]["layers_0"]
    assert "bias" not in block["query_key_value"] and "bias" not in block["dense"]


def test_integer_fields_must_be_at_least_one():
    from beyondpar.pretrained import config_fields

    assert config_fields.field({"num_hidden_layers": 1}, "num_hidden_layers") == 1
    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be an integer >= 1, got 0"):
        config_fields.field({"num_hidden_layers": 0}, "num_hidden_layers")


def test_number_fields_refuse_booleans():
    from beyondpar.pretrained import config_fields

    assert config_fields.field({"rope_theta": 10}, "rope_theta", float) == 10.0
    with pytest.raises(ValueError, match=r"'rope_theta' must be a number, got True"):
        config_fields.field({"rope_theta": True}, "rope_theta", float)


def test_positive_number_refuses_zero_and_allows_null_only_when_nullable():
    from beyondpar.pretrained import config_fields

    assert config_fields.positive_number({"w": 0.5}, "w") == 0.5
    assert config_fields.positive_number({"w": None}, "w", nullable=True) is None
    with pytest.raises(ValueError, match=r"'w' must be a number > 0, got 0"):
        config_fields.positive_number({"w": 0}, "w")
    with pytest.raises(ValueError, match=r"'w' must be a number > 0 or null, got 0"):
        config_fields.positive_number({"w": 0}, "w", nullable=True)


def test_integer_fields_refuse_booleans():
    from beyondpar.pretrained import config_fields

    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be an integer >= 1, got True"):
        config_fields.field({"num_hidden_layers": True}, "num_hidden_layers")


def test_positive_number_missing_or_null_is_refused_unless_nullable():
    from beyondpar.pretrained import config_fields

    with pytest.raises(ValueError, match=r"'w' must be a number > 0, got None"):
        config_fields.positive_number({"w": None}, "w")
    with pytest.raises(ValueError, match=r"'w' must be a number > 0, got None"):
        config_fields.positive_number({}, "w")
    assert config_fields.positive_number({}, "w", nullable=True) is None
