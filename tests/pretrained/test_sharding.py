"""Pretrained models on a data x model mesh of four (fake CPU) devices: the same logits
and attention as on one device for every family, parameters really split along the axis
their layout asks for, one layer's attention gathered over `model` at a time."""

import gguf
import jax
import numpy as np
import pytest
from gguf_export import export
from jax.sharding import PartitionSpec as P

from beyondpar import pretrained
from beyondpar.base import parallel
from beyondpar.pretrained import gguf_quants
from conftest import DATA

HF = DATA / "hf"
FAMILIES = ("gpt2-tiny", "llama-tiny", "llama3-rope", "neox-tiny", "qwen3-tiny", "mistral-window")
MESHES = [(1, 4), (2, 2)]
# Sharded against one device: float32 sums in another order (llama3-rope's attention
# moves by 1.1e-6 with the rotary rates of `rotary.Rope`).
ATTENTION_ATOL = 5e-6
# (layer module, kernel spec) of a query projection and an MLP projection per family.
Q_AND_MLP = {
    "gpt2-tiny": (("c_attn", P(None, "model")), ("c_fc", P(None, "model"))),
    "neox-tiny": (("query_key_value", P(None, "model")), ("dense_4h_to_h", P("model", None))),
}
LLAMA_LIKE = (("q_proj", P(None, "model")), ("down_proj", P("model", None)))


def expected(name):
    return dict(np.load(HF / name / "expected.npz"))


@pytest.fixture(scope="module")
def unsharded():
    out = {}
    for name in FAMILIES:
        module, params, _ = pretrained.load(HF / name, progress=False)
        tokens = np.concatenate([expected(name)["tokens"]] * 2)  # a batch that splits in two
        out[name] = tokens, *pretrained.apply_with_attention(module, params, tokens)
    return out


@pytest.mark.parametrize("data,model", MESHES)
@pytest.mark.parametrize("name", FAMILIES)
def test_sharded_run_equals_one_device(unsharded, name, data, model):
    tokens, logits, attn = unsharded[name]
    mesh = parallel.model_mesh(data, model)
    module, params, _ = pretrained.load(HF / name, mesh=mesh, progress=False)
    placed = pretrained.place_tokens(params, tokens)
    assert placed.sharding.spec == P("data") and placed.sharding.mesh.shape == mesh.shape
    got_logits, got_attn = pretrained.apply_with_attention(module, params, placed)
    np.testing.assert_allclose(got_logits, logits, atol=1e-5)
    np.testing.assert_allclose(got_attn, attn, atol=ATTENTION_ATOL)
    np.testing.assert_allclose(
        got_logits, np.concatenate([expected(name)["logits"]] * 2), atol=1e-4
    )
    run = pretrained.layer_by_layer(module, params, placed)
    for layer in range(module.config.num_layers):
        index, layer_attn = next(run)
        assert index == layer
        # Gathered over model: every head on each device, the batch of 4 over the 4 devices.
        assert {s.data.shape for s in layer_attn.addressable_shards} == {(1, *attn.shape[2:])}
        assert layer_attn.sharding.device_set == set(jax.local_devices())
        np.testing.assert_allclose(layer_attn, attn[:, layer], atol=ATTENTION_ATOL)
    odd = pretrained.layer_by_layer(module, params, placed[:2])  # 2 windows on 4 devices
    assert next(odd)[1].sharding.device_set == {mesh.devices.flat[0]}


@pytest.mark.parametrize("name", FAMILIES)
def test_heads_and_mlp_features_are_split_along_model(name):
    mesh = parallel.model_mesh(1, 4)
    module, params, _ = pretrained.load(HF / name, mesh=mesh, progress=False)
    layer = params[pretrained.layer_name(module, 0)]
    for part, spec in Q_AND_MLP.get(name, LLAMA_LIKE):
        kernel = layer[part]["kernel"]
        assert kernel.sharding.spec == spec, part
        axis = spec.index("model")
        shard = kernel.addressable_shards[0].data
        assert shard.shape[axis] == kernel.shape[axis] // 4 and len(kernel.sharding.device_set) == 4
        assert shard.shape[1 - axis] == kernel.shape[1 - axis]
    norm = jax.tree.leaves(layer[next(k for k in layer if "norm" in k or k.startswith("ln"))])[0]
    assert norm.sharding.spec == P()


def test_kv_heads_split_only_when_they_divide():
    """llama-tiny has 4 query heads on 2 kv heads: k/v split on 2 devices, whole on 4."""
    for model, spec in ((2, P(None, "model")), (4, P())):
        mesh = parallel.model_mesh(1, model)
        _, params, _ = pretrained.load(HF / "llama-tiny", mesh=mesh, progress=False)
        assert params["layers_0"]["k_proj"]["kernel"].sharding.spec == spec
        assert params["layers_0"]["v_proj"]["kernel"].sharding.spec == spec
        assert params["layers_0"]["o_proj"]["kernel"].sharding.spec == P("model", None)


def test_gguf_loads_straight_onto_the_mesh(tmp_path, unsharded):
    path = export(HF / "llama-tiny", tmp_path / "model.gguf")
    mesh = parallel.model_mesh(2, 2)
    module, params, _ = pretrained.load(path, mesh=mesh, progress=False)
    assert params["layers_1"]["up_proj"]["kernel"].sharding.spec == P(None, "model")
    assert params["lm_head"]["embedding"].sharding.spec == P("model", None)
    tokens, logits, _ = unsharded["llama-tiny"]
    got, _ = pretrained.apply_with_attention(
        module, params, pretrained.place_tokens(params, tokens)
    )
    np.testing.assert_allclose(got, logits, atol=1e-5)


@pytest.mark.parametrize("kernels", [True, False])
def test_default_is_one_device_and_tokens_follow_the_parameters(tmp_path, monkeypatch, kernels):
    """Every parameter on the 1 x 1 mesh, whether its kernel's output was kept in place
    or it came through NumPy: a batch placed beside them runs."""
    if kernels:
        monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    path = export(HF / "llama-tiny", tmp_path / "model.gguf", gguf.GGMLQuantizationType.Q8_0)
    module, params, _ = pretrained.load(path, progress=False)
    meshes = {x.sharding.mesh for x in jax.tree.leaves(params)}
    assert len(meshes) == 1 and next(iter(meshes)).devices.tolist() == [[jax.local_devices()[0]]]
    tokens = pretrained.place_tokens(params, expected("llama-tiny")["tokens"])
    assert tokens.sharding.device_set == {jax.local_devices()[0]}
    logits = pretrained.layer_by_layer(module, params, tokens)
    assert next(logits)[1].shape == (2, 4, 64, 64)
