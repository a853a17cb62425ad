"""Hugging Face checkpoints in JAX: parity with transformers, layouts, cache, bad input."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from beyondpar import pretrained
from conftest import DATA

HF = DATA / "hf"
FAMILIES = ("gpt2-tiny", "llama-tiny", "llama3-rope")


def expected(name):
    return dict(np.load(HF / name / "expected.npz"))


def copy_checkpoint(name, tmp_path, config=None, tensors=None) -> Path:
    """A copy of a fixture folder with config fields and tensors changed."""
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        data.update(config)
        (folder / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        weights = load_file(folder / "model.safetensors")
        save_file(tensors(weights), folder / "model.safetensors")
    return folder


def logits_and_attention(folder, tokens=None, dtype=None):
    module, params, _ = pretrained.load(folder, dtype)
    tokens = expected("llama-tiny")["tokens"] if tokens is None else tokens
    return pretrained.apply_with_attention(module, params, tokens)


@pytest.mark.parametrize("name", FAMILIES)
def test_parity_with_transformers(name):
    exp = expected(name)
    module, params, tokenizer = pretrained.load(HF / name)
    ids = tokenizer.encode(str(exp["text"])).ids
    np.testing.assert_array_equal(ids[: exp["tokens"].shape[1]], exp["tokens"][0])
    logits, attn = pretrained.apply_with_attention(module, params, exp["tokens"])
    assert attn.dtype == jnp.float32 and attn.shape == exp["attention"].shape
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
    np.testing.assert_allclose(np.stack([a for _, a in got], 1), exp["attention"][:1], atol=1e-5)
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
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            r"'rope_type' must be one of \['default', 'llama3'\], got 'yarn'",
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
    with pytest.raises(FileNotFoundError, match="must be a checkpoint folder or a model name"):
        pretrained.load(tmp_path / "no" / "such" / "folder")


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


def test_texts_longer_than_the_context_or_window_are_errors(tmp_path):
    module, params, _ = pretrained.load(HF / "gpt2-tiny")
    with pytest.raises(ValueError, match="at most the model's context of 64 tokens, got 65"):
        pretrained.apply_with_attention(module, params, np.zeros((1, 65), int))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 300\), got \[0, 300\]"):
        pretrained.apply_with_attention(module, params, np.array([[0, 300]]))
    folder = copy_checkpoint(
        "llama-tiny", tmp_path, {"model_type": "mistral", "sliding_window": 16}
    )
    module, params, _ = pretrained.load(folder)
    pretrained.apply_with_attention(module, params, np.zeros((1, 16), int))
    with pytest.raises(ValueError, match="'sliding_window'=16 .*got 17 tokens"):
        pretrained.apply_with_attention(module, params, np.zeros((1, 17), int))
