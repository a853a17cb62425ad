"""Pretrained models on a data x model mesh of four (fake CPU) devices: the logits and
attention of every fixture, as close to transformers' float64 ones as on one device,
parameters really split along the axis their layout asks for (Phi-3's fused projections
by whole groups), one layer's attention gathered over `model` at a time."""

import dataclasses
from types import SimpleNamespace

import gguf
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file

from beyondpar import pretrained
from beyondpar.base import parallel
from beyondpar.pretrained import hf_folder, sharding
from beyondpar.pretrained.gguf import quants as gguf_quants
from beyondpar.pretrained.loading import family
from helpers.gguf_export import export
from helpers.hf_fixtures import CONFIG_VARIANTS
from helpers.paths import DATA

HF = DATA / "hf"
FIXTURES = sorted(
    p.name for p in HF.iterdir() if (p / "expected.npz").is_file() and p.name not in CONFIG_VARIANTS
)
MESHES = [(1, 4), (2, 2)]
# Each fixture sharded on one mesh: (2, 2) splits the batch as well, (1, 4) puts all four
# devices on `model`, where more head counts do not divide (two key-value heads, or
# gemma3-multimodal's two heads) and those projections stay whole. Every family runs on
# both meshes (a family of one fixture runs it on both): each branch is still taken.
# llama-tiny and phi3-tiny are on (2, 2), where their GGUF files load onto the mesh.
SHARDED_ON = {
    "gemma2-pattern": [(2, 2)],
    "gemma2-tiny": [(1, 4)],
    "gemma3-legacy": [(2, 2)],
    "gemma3-multimodal": [(1, 4)],
    "gemma3-tiny": [(2, 2)],
    "gpt2-tiny": MESHES,
    "llama-tiny": [(2, 2)],
    "llama3-rope": [(1, 4)],
    "mistral-window": [(1, 4)],
    "neox-tiny": MESHES,
    "phi3-longrope": [(1, 4)],
    "phi3-tiny": [(2, 2)],
    "qwen3-tiny": [(2, 2)],
}
# One layer at a time on the mesh (a family's blocks sharded, each layer's attention
# gathered over `model`): one fixture of each family on each mesh, Gemma's with two
# kinds of layer (gemma3-tiny). That every fixture's blocks go one layer at a time as the
# whole forward does is test_running's, on one device.
LAYER_BY_LAYER_ON = {
    ("gpt2-tiny", (1, 4)),
    ("gpt2-tiny", (2, 2)),
    ("neox-tiny", (1, 4)),
    ("neox-tiny", (2, 2)),
    ("llama-tiny", (2, 2)),
    ("mistral-window", (1, 4)),
    ("gemma3-tiny", (2, 2)),
    ("gemma3-multimodal", (1, 4)),  # 2 query heads on a 4-wide model axis: kept whole
    ("gemma2-tiny", (1, 4)),
    ("phi3-tiny", (2, 2)),
    ("phi3-longrope", (1, 4)),
}
# A batch that does not split over the devices gathers each layer's attention on the
# mesh's first device whatever the family: checked on the fixture sharded on both meshes.
ODD_BATCH_ON = ("gpt2-tiny",)
# Sharded against the fixture's float64 outputs (the exact model, so no one-device float32
# run to compile per fixture): float32 round-off, its sums in another order. Two kinds of
# random fixture magnify it the most: Gemma 3's (q/k norms, six layers in gemma3-tiny) and
# phi3-longrope (long factors up to 11), whose float32 attention is 8.6e-6 from its float64
# one on one device and 1.3e-5 sharded (an AMD EPYC; the other fixtures 6e-7 to 8e-7 on
# one device, at most 7e-6 sharded; sharded logits at most 3.7e-6, gemma3-tiny's 3.1e-5).
ATOL = {"logits": 2e-5, "attention": 1e-5}
ILL_CONDITIONED = ("gemma3", "phi3-longrope")
ILL_CONDITIONED_ATOL = {"logits": 1e-4, "attention": 5e-5}
# (layer module, unit it splits by, split axis of its kernel): a projection that makes
# heads and an MLP projection of each family.
PROJECTIONS = {
    "Gpt2": (("c_attn", "heads", 1), ("c_fc", "features", 1)),
    "GptNeox": (("query_key_value", "heads", 1), ("dense_4h_to_h", "features", 0)),
    "Phi3": (("qkv_proj", "kv_heads", 1), ("gate_up_proj", "features", 1)),
}
LLAMA_LIKE = (("q_proj", "heads", 1), ("down_proj", "features", 0))  # Llama, Gemma


def expected(name):
    return dict(np.load(HF / name / "expected.npz"))


def doubled(name):
    """The fixture's tokens, float64 logits and attention twice over: a batch of 4 that
    splits in two along `data` and in four for the layer by layer gather."""
    exp = expected(name)
    return [np.concatenate([exp[key]] * 2) for key in ("tokens", "logits", "attention")]


def atol(name, what):
    return (ILL_CONDITIONED_ATOL if name.startswith(ILL_CONDITIONED) else ATOL)[what]


def test_every_fixture_and_family_is_checked():
    families = {type(pretrained.build(hf_folder.read_config(HF / n))).__name__ for n in FIXTURES}
    assert families == {"Gpt2", "GptNeox", "Llama", "Gemma", "Phi3"} and len(FIXTURES) == 13


def test_every_fixture_is_sharded_and_every_family_on_every_mesh():
    assert sorted(SHARDED_ON) == FIXTURES
    by_family = {}
    for name, meshes in SHARDED_ON.items():
        family = type(pretrained.build(hf_folder.read_config(HF / name))).__name__
        by_family.setdefault(family, set()).update(meshes)
    assert all(meshes == set(MESHES) for meshes in by_family.values()), by_family
    layer_by_layer = {}
    for name, mesh in LAYER_BY_LAYER_ON:
        assert mesh in SHARDED_ON[name], (name, mesh)
        family = type(pretrained.build(hf_folder.read_config(HF / name))).__name__
        layer_by_layer.setdefault(family, set()).add(mesh)
    assert layer_by_layer == {family: set(MESHES) for family in by_family}, layer_by_layer


@pytest.mark.parametrize(
    "name,data,model", [(n, *mesh) for n, meshes in SHARDED_ON.items() for mesh in meshes]
)
def test_sharded_run_equals_the_fixture(name, data, model):
    tokens, logits, attn = doubled(name)
    mesh = parallel.model_mesh(data, model)
    module, params, _ = pretrained.load(HF / name, mesh=mesh, progress=False)
    placed = pretrained.place_tokens(params, tokens)
    assert placed.sharding.spec == P("data") and placed.sharding.mesh.shape == mesh.shape
    got_logits, got_attn = pretrained.apply_with_attention(module, params, placed)
    np.testing.assert_allclose(got_logits, logits, atol=atol(name, "logits"))
    np.testing.assert_allclose(got_attn, attn, atol=atol(name, "attention"))
    if (name, (data, model)) in LAYER_BY_LAYER_ON:
        check_one_layer_at_a_time(name, mesh, module, params, placed, attn)


def check_one_layer_at_a_time(name, mesh, module, params, placed, attn):
    """Each layer's attention on the mesh, gathered over `model`, as the whole forward's."""
    run = pretrained.layer_by_layer(module, params, placed)
    for layer in range(module.config.num_layers):
        index, layer_attn = next(run)
        assert index == layer
        # Gathered over model: every head on each device, the batch of 4 over the 4 devices.
        assert {s.data.shape for s in layer_attn.addressable_shards} == {(1, *attn.shape[2:])}
        assert layer_attn.sharding.device_set == set(jax.local_devices())
        np.testing.assert_allclose(layer_attn, attn[:, layer], atol=atol(name, "attention"))
    if name in ODD_BATCH_ON:  # the same branch of `gather_heads` for every family
        odd = pretrained.layer_by_layer(module, params, placed[:2])  # 2 windows on 4 devices
        assert next(odd)[1].sharding.device_set == {mesh.devices.flat[0]}


@pytest.mark.parametrize(
    "name,kinds",
    [("gemma3-tiny", 2), ("gemma3-legacy", 2), ("mistral-window", 1), ("llama-tiny", 1)],
)
def test_layers_alike_share_one_block(name, kinds):
    """Going one layer at a time, the layers with the same window (and, for Gemma, rope)
    get one block, so one compiled program: gemma3-tiny's five local layers and one
    global one run two programs, not six, and a model without windows one. Each block
    has its own layer's window and rope."""
    module = pretrained.build(hf_folder.read_config(HF / name))
    cfg = module.config
    blocks = [family(module).block_module(cfg, i) for i in range(cfg.num_layers)]
    assert len(set(blocks)) == kinds < cfg.num_layers
    ropes = getattr(cfg, "layer_ropes", (None,) * cfg.num_layers)
    windows = cfg.layer_windows or (None,) * cfg.num_layers  # llama-tiny: no windows
    for i, block in enumerate(blocks):
        assert windows[block.layer_index] == windows[i]
        assert ropes[block.layer_index] == ropes[i]


@pytest.mark.parametrize("model", [2, 4])
@pytest.mark.parametrize("name", FIXTURES)
def test_heads_and_mlp_features_are_split_along_model(name, model):
    """Split into `model` equal parts along the named axis when the unit (query heads,
    kv heads for Phi-3's fused qkv, MLP features) divides, else whole on every device;
    every norm whole."""
    mesh = parallel.model_mesh(1, model)
    module, params, _ = pretrained.load(HF / name, mesh=mesh, progress=False)
    units = sharding.units(module.config)
    layer = params[pretrained.layer_name(module, 0)]
    for part, unit, axis in PROJECTIONS.get(type(module).__name__, LLAMA_LIKE):
        kernel = layer[part]["kernel"]
        shard = kernel.addressable_shards[0].data
        if units[unit] % model:
            assert kernel.sharding.spec == P() and shard.shape == kernel.shape, part
            continue
        assert kernel.sharding.spec == (P("model", None) if axis == 0 else P(None, "model"))
        assert (
            shard.shape[axis] == kernel.shape[axis] // model
            and len(kernel.sharding.device_set) == model
        )
        assert shard.shape[1 - axis] == kernel.shape[1 - axis]
    norms = [k for k in layer if "norm" in k or k.startswith("ln")]
    assert norms and all(
        x.sharding.spec == P() for k in norms for x in jax.tree.leaves(layer[k])
    ), norms


@pytest.mark.parametrize("name", ["llama-tiny", "gemma2-tiny", "phi3-tiny"])
def test_kv_heads_split_only_when_they_divide(name):
    """4 query heads on 2 kv heads: k/v (Phi-3: the fused qkv) split on 2 devices, whole
    on 4; the output projection split by query heads on both."""
    for model, spec in ((2, P(None, "model")), (4, P())):
        mesh = parallel.model_mesh(1, model)
        _, params, _ = pretrained.load(HF / name, mesh=mesh, progress=False)
        layer = params["layers_0"]
        for part in ("qkv_proj",) if name.startswith("phi3") else ("k_proj", "v_proj"):
            assert layer[part]["kernel"].sharding.spec == spec, (part, model)
        assert layer["o_proj"]["kernel"].sharding.spec == P("model", None)


def test_phi3_devices_hold_whole_groups_and_matching_gate_and_up():
    """phi3-tiny on 2 devices: device g holds query heads 2g and 2g + 1 with their key
    and value head g, and the gate and up features of the same half, straight from the
    checkpoint's rows."""
    stored = load_file(HF / "phi3-tiny" / "model.safetensors")
    module, params, _ = pretrained.load(HF / "phi3-tiny", mesh=parallel.model_mesh(1, 2))
    cfg = module.config
    d, heads, kv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    assert (heads, kv) == (4, 2)
    q, k, v = np.split(
        stored["model.layers.1.self_attn.qkv_proj.weight"], [heads * d, (heads + kv) * d]
    )
    gate, up = np.split(stored["model.layers.1.mlp.gate_up_proj.weight"], 2)
    groups, halves = [], []
    for shard in params["layers_1"]["qkv_proj"]["kernel"].addressable_shards:
        g = shard.index[1].start // (4 * d)  # a group: 2 query heads, 1 key, 1 value head
        group = [q[2 * g * d : (2 * g + 2) * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
        np.testing.assert_array_equal(shard.data, np.concatenate(group).T)
        groups.append(g)
    for shard in params["layers_1"]["gate_up_proj"]["kernel"].addressable_shards:
        half = slice(shard.index[1].start // 2, shard.index[1].stop // 2)
        side_by_side = np.stack([gate[half], up[half]], axis=1).reshape(-1, gate.shape[1])
        np.testing.assert_array_equal(shard.data, side_by_side.T)
        halves.append(half.start)
    assert sorted(groups) == [0, 1] and sorted(halves) == [0, cfg.mlp_dim // 2]


@pytest.mark.parametrize("name", ["llama-tiny", "gemma3-legacy", "phi3-tiny"])
def test_gguf_loads_straight_onto_the_mesh(tmp_path, monkeypatch, name):
    """Through the kernels, fix-ups and all (Llama's rows, Gemma's norms, Phi-3's groups),
    untied heads as stored: the logits of the same file on one device. A file whose
    module is the Hugging Face one with its norm epsilon rounded to float32 (the same
    float32 model) runs as that module: llama-tiny's and phi3-tiny's runs on the mesh
    are then the programs of their fixtures' sharded runs (both on (2, 2))."""
    monkeypatch.setattr(gguf_quants, "KERNEL_MIN_VALUES", 0)
    path = export(HF / name, tmp_path / "model.gguf", gguf.GGMLQuantizationType.F16)
    tokens = np.concatenate([expected(name)["tokens"]] * 2)
    stored, params, _ = pretrained.load(path, progress=False)
    module = as_hugging_face(stored, name)
    assert (module is stored) == (name == "gemma3-legacy")  # llama.cpp's own Gemma 3
    want, _ = pretrained.apply_with_attention(module, params, tokens)
    on_mesh, params, _ = pretrained.load(path, mesh=parallel.model_mesh(2, 2), progress=False)
    assert on_mesh == stored
    up = "gate_up_proj" if name.startswith("phi3") else "up_proj"
    assert params["layers_1"][up]["kernel"].sharding.spec == P(None, "model")
    assert params["lm_head"]["embedding"].sharding.spec == P("model", None)
    got, _ = pretrained.apply_with_attention(
        module, params, pretrained.place_tokens(params, tokens)
    )
    np.testing.assert_allclose(got, want, atol=atol(name, "logits"))
    if name != "gemma3-legacy":  # llama.cpp runs Gemma 3 its own way (test_gguf_reader)
        np.testing.assert_allclose(got[:2], expected(name)["logits"], atol=5e-3)


def as_hugging_face(gguf_module, name):
    """The fixture's own module when `gguf_module` is it with the norm epsilon rounded
    to float32 as a GGUF file stores it, else `gguf_module`."""
    module = pretrained.build(hf_folder.read_config(HF / name))
    eps = float(np.float32(module.config.eps))
    as_stored = module.clone(config=dataclasses.replace(module.config, eps=eps))
    return module if as_stored == gguf_module else gguf_module


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


def test_gpt2_output_projection_embeddings_and_biases_follow_the_megatron_layout():
    """gpt2-untied on 2 devices: the attention output projection reads split heads, so
    each device holds its heads' input rows of the checkpoint's kernel and the whole bias;
    the fused qkv bias splits with its output features; the token embedding and the
    untied output head each split their 300 vocabulary rows, 150 per device, as stored."""
    stored = load_file(HF / "gpt2-untied" / "model.safetensors")
    _, params, _ = pretrained.load(HF / "gpt2-untied", mesh=parallel.model_mesh(1, 2))
    layer = params["h_1"]
    proj = layer["c_proj"]["kernel"]
    assert proj.sharding.spec == P("model", None)
    for shard in proj.addressable_shards:
        assert shard.data.shape == (16, 32)
        np.testing.assert_array_equal(
            shard.data, stored["transformer.h.1.attn.c_proj.weight"][shard.index]
        )
    assert layer["c_proj"]["bias"].sharding.spec == P()
    qkv_bias = layer["c_attn"]["bias"]
    assert qkv_bias.sharding.spec == P("model")
    assert {s.data.shape for s in qkv_bias.addressable_shards} == {(48,)}
    for part, key in (("wte", "transformer.wte.weight"), ("lm_head", "lm_head.weight")):
        table = params[part]["embedding"]
        assert table.sharding.spec == P("model", None), part
        starts = []
        for shard in table.addressable_shards:
            assert shard.data.shape == (150, 32), part
            np.testing.assert_array_equal(shard.data, stored[key][shard.index])
            starts.append(shard.index[0].start)
        assert sorted(starts) == [0, 150], part


def test_partition_specs_of_each_kind_of_parameter_on_three_devices():
    """A hand-made config on a model axis of 3: 6 heads, 3 kv heads, 9 MLP features and 12
    vocabulary rows all divide; a kernel that makes heads splits its last (output) axis
    however many axes it has, one that reads them its first; biases split only with
    output features; embeddings split rows; units that do not divide, norms, unknown
    modules and a single device keep the parameter whole."""
    cfg = SimpleNamespace(num_heads=6, num_kv_heads=3, mlp_dim=9, vocab_size=12)
    cases = {
        (("layers_0", "q_proj", "kernel"), 3): P(None, None, "model"),
        (("layers_0", "k_proj", "kernel"), 2): P(None, "model"),
        (("layers_0", "q_proj", "bias"), 1): P("model"),
        (("layers_0", "o_proj", "kernel"), 3): P("model", None, None),
        (("layers_0", "o_proj", "bias"), 1): P(),
        (("layers_0", "down_proj", "kernel"), 2): P("model", None),
        (("h_0", "c_proj", "kernel"), 2): P("model", None),
        (("h_0", "c_proj", "bias"), 1): P(),
        (("h_0", "c_fc", "bias"), 1): P("model"),
        (("embed_tokens", "embedding"), 2): P("model", None),
        (("lm_head", "embedding"), 2): P("model", None),
        (("layers_0", "input_layernorm", "scale"), 1): P(),
        (("layers_0", "mystery", "kernel"), 2): P(),
        (("embedding",), 2): P(),
    }
    for (keys, ndim), spec in cases.items():
        assert sharding.partition_spec(keys, ndim, cfg, 3) == spec, keys
    assert sharding.partition_spec(("q_proj", "kernel"), 2, cfg, 1) == P()
    # 7 features, 13 vocabulary rows, 4 heads: none divides by 3
    odd = SimpleNamespace(num_heads=4, num_kv_heads=3, mlp_dim=7, vocab_size=13)
    for keys in (("up_proj", "kernel"), ("wte", "embedding"), ("c_attn", "kernel")):
        assert sharding.partition_spec(keys, 2, odd, 3) == P(), keys
    assert sharding.partition_spec(("v_proj", "kernel"), 2, odd, 3) == P(None, "model")
    # no kv head count (GPT-2, GPT-NeoX): keys and values count as many as the queries
    gpt2 = SimpleNamespace(num_heads=6, mlp_dim=7, vocab_size=13)
    assert sharding.partition_spec(("k_proj", "kernel"), 2, gpt2, 3) == P(None, "model")
    assert sharding.units(gpt2) == {"heads": 6, "kv_heads": 6, "features": 7, "vocab": 13}


def test_projections_that_read_split_units_split_their_input_rows():
    """GPT-NeoX's attention output (`dense`) and MLP down projection (`dense_4h_to_h`)
    and GPT-2's MLP output (`mlp_c_proj`) read split heads or features: their kernels
    split the first (input) axis and their biases stay whole. Each splits by its own
    unit: on 3 devices with 4 heads and 9 features the head-reading `dense` stays whole
    while the feature-reading projections still split; with 6 heads and 7 features it is
    the other way round."""
    heads_odd = SimpleNamespace(num_heads=4, mlp_dim=9, vocab_size=13)
    features_odd = SimpleNamespace(num_heads=6, mlp_dim=7, vocab_size=13)
    for cfg, splits in ((heads_odd, ("dense_4h_to_h", "mlp_c_proj")), (features_odd, ("dense",))):
        for module in ("dense", "dense_4h_to_h", "mlp_c_proj"):
            kernel = sharding.partition_spec(("layers_0", module, "kernel"), 2, cfg, 3)
            want = P("model", None) if module in splits else P()
            assert kernel == want, (module, cfg)
            assert sharding.partition_spec(("layers_0", module, "bias"), 1, cfg, 3) == P()
