"""Running a loaded checkpoint: one layer at a time equal to the whole forward, head
masks (per sequence too), texts too long, head importances of the attention output
projection, and token placement on a mesh."""

import json
import shutil

import jax
import numpy as np
import pytest

from beyondpar import pretrained
from beyondpar.base import parallel
from helpers.hf_fixtures import ATTENTION_ATOL, FAMILIES, HF, expected
from helpers.paths import DATA

LLAMA = DATA / "hf" / "llama-tiny"  # 2 layers, 4 query heads, 2 kv heads, head_dim 8


@pytest.fixture(scope="module")
def llama():
    module, params, _ = pretrained.load(LLAMA, progress=False)
    return module, params


def test_layer_by_layer_takes_each_sequences_own_head_mask():
    """A (B, L, H) mask gives each sequence its own heads in every layer: one layer at a
    time must equal the whole forward with the same mask, for attention and logits.
    qwen3-tiny (2 layers, 4 heads) on its fixture's tokens: the whole forward with a
    per-sequence mask is the program the head-mask test runs."""
    module, params, _ = pretrained.load(HF / "qwen3-tiny", progress=False)
    tokens = expected("qwen3-tiny")["tokens"]
    assert tokens.shape[0] == 2
    assert (module.config.num_layers, module.config.num_heads) == (2, 4)
    rng = np.random.default_rng(0)
    mask = rng.uniform(0.0, 1.0, size=(2, 2, 4)).astype(np.float32)
    mask[0, 1, 2] = 0.0
    logits, attn = pretrained.apply_with_attention(module, params, tokens, mask)
    gen = pretrained.layer_by_layer(module, params, tokens, mask)
    layers = []
    while True:
        try:
            layers.append(next(gen))
        except StopIteration as stop:
            last = stop.value
            break
    assert [i for i, _ in layers] == [0, 1]
    for i, a in layers:
        np.testing.assert_allclose(np.asarray(a), np.asarray(attn[:, i]), atol=1e-5)
    np.testing.assert_allclose(np.asarray(last), np.asarray(logits), atol=1e-4)


def test_head_importances_are_frobenius_norms_of_each_query_heads_rows(llama):
    """Head h of layer l weighs the rows [8h, 8h + 8) of that layer's o_proj kernel
    (in = 4 query heads x 8 features): one norm per query head, not per kv head."""
    module, params = llama
    got = np.asarray(pretrained.head_importances(module, params))
    assert got.shape == (2, 4)
    for layer in range(2):
        k = np.asarray(params[f"layers_{layer}"]["o_proj"]["kernel"], np.float64)
        for h in range(4):
            want = np.sqrt(np.sum(k[8 * h : 8 * h + 8, :] ** 2))
            np.testing.assert_allclose(got[layer, h], want, rtol=1e-5)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs two devices")
def test_tokens_split_along_data_by_batch_not_length():
    """A batch of 4 texts of length 3 on a data=2 mesh splits the batch (2 texts per
    device); a batch of 3 of length 4 does not divide and is replicated."""
    mesh = parallel.model_mesh(data=2, model=1, devices=jax.devices()[:2])
    params = {"w": jax.device_put(np.ones(2, np.float32), parallel.replicated(mesh))}
    split = pretrained.place_tokens(params, np.arange(12, dtype=np.int32).reshape(4, 3))
    assert {s.data.shape for s in split.addressable_shards} == {(2, 3)}
    whole = pretrained.place_tokens(params, np.arange(12, dtype=np.int32).reshape(3, 4))
    assert {s.data.shape for s in whole.addressable_shards} == {(3, 4)}


def _attention(batch: int, heads: int = 4, t: int = 3) -> np.ndarray:
    return np.arange(batch * heads * t * t, dtype=np.float32).reshape(batch, heads, t, t)


def test_gather_heads_brings_a_layers_heads_together_per_sequence():
    """Heads split over a model=4 mesh reach the kernels with every head of a sequence on
    one device: split along the batch over the local devices when it divides, else whole
    on the mesh's first device. Values never change."""
    mesh = parallel.model_mesh(data=1, model=4, devices=jax.devices()[:4])
    by_head = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, parallel.MODEL))
    for batch, shard_shape in [(4, (1, 4, 3, 3)), (3, (3, 4, 3, 3))]:
        attn = jax.device_put(_attention(batch), by_head)
        assert {s.data.shape for s in attn.addressable_shards} == {(batch, 1, 3, 3)}
        gathered = pretrained.gather_heads(attn, mesh)
        assert {s.data.shape for s in gathered.addressable_shards} == {shard_shape}
        np.testing.assert_array_equal(np.asarray(gathered), _attention(batch))
    assert pretrained.gather_heads(attn, mesh).devices() == {mesh.devices.flat[0]}


def test_gather_heads_leaves_a_batch_split_over_every_device_alone():
    """On a data-only mesh over every local device the batch is already split with whole
    heads: the same array comes back, as it does without a mesh or on one device."""
    mesh = parallel.model_mesh(data=4, model=1, devices=jax.devices()[:4])
    attn = jax.device_put(_attention(4), parallel.batch_sharded(mesh))
    assert pretrained.gather_heads(attn, mesh) is attn
    assert pretrained.gather_heads(attn, None) is attn
    single = jax.device_put(_attention(2), jax.devices()[1])
    assert pretrained.gather_heads(single, mesh) is single
    mixed = parallel.model_mesh(data=2, model=2, devices=jax.devices()[:4])
    both = jax.sharding.PartitionSpec(parallel.DATA, parallel.MODEL)
    attn = jax.device_put(_attention(4), jax.sharding.NamedSharding(mixed, both))
    gathered = pretrained.gather_heads(attn, mixed)
    assert {s.data.shape for s in gathered.addressable_shards} == {(1, 4, 3, 3)}
    np.testing.assert_array_equal(np.asarray(gathered), _attention(4))


def test_gather_heads_on_a_mesh_over_part_of_the_devices_divides_by_every_device():
    """A model=2 mesh over two of the four local devices: a batch that divides by the four
    local devices is split over all four (one sequence each), one that divides only by the
    mesh's two is brought whole to the mesh's first device. Values never change."""
    devices = jax.devices()[:4]
    mesh = parallel.model_mesh(data=1, model=2, devices=devices[:2])
    by_head = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, parallel.MODEL))
    for batch, shard_shape, placed_on in [(4, (1, 4, 3, 3), set(devices)), (2, (2, 4, 3, 3), None)]:
        attn = jax.device_put(_attention(batch), by_head)
        assert {s.data.shape for s in attn.addressable_shards} == {(batch, 2, 3, 3)}
        gathered = pretrained.gather_heads(attn, mesh)
        assert {s.data.shape for s in gathered.addressable_shards} == {shard_shape}
        assert gathered.devices() == (placed_on or {mesh.devices.flat[0]})
        np.testing.assert_array_equal(np.asarray(gathered), _attention(batch))


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_by_layer_equals_the_whole_forward(name):
    """Both sequences of the fixture: the shape the head-mask tests run, so the
    embedding and the output head are compiled once for both."""
    exp = expected(name)
    module, params, _ = pretrained.load(HF / name)
    layers = pretrained.layer_by_layer(module, params, exp["tokens"])
    got = []
    with pytest.raises(StopIteration) as stop:
        while True:
            got.append(next(layers))
    assert [i for i, _ in got] == list(range(module.config.num_layers))
    atol = ATTENTION_ATOL.get(name, 1e-5)
    np.testing.assert_allclose(np.stack([a for _, a in got], 1), exp["attention"], atol=atol)
    np.testing.assert_allclose(stop.value.value, exp["logits"], atol=1e-4)


def test_texts_longer_than_the_context_are_errors():
    module, params, _ = pretrained.load(HF / "gpt2-tiny")
    with pytest.raises(ValueError, match="at most the model's context of 64 tokens, got 65"):
        pretrained.apply_with_attention(module, params, np.zeros((1, 65), int))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 300\), got \[0, 300\]"):
        pretrained.apply_with_attention(module, params, np.array([[0, 300]]))


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
    # Placed as the loaded kernel is, so the edited model runs the plain model's program.
    kernel = jax.device_put(kernel, params[layer][out_name]["kernel"].sharding)
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


def test_bad_head_masks_are_named(llama):
    module, params = llama
    tokens = expected("llama-tiny")["tokens"]
    with pytest.raises(ValueError, match=r"head_mask must have shape \(L, H\) = \(2, 4\)"):
        pretrained.apply_with_attention(module, params, tokens, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"head_mask entries must be in \[0, 1\], got range"):
        pretrained.apply_with_attention(module, params, tokens, 2 * np.ones((2, 4)))


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


@pytest.mark.parametrize(
    "tokens,mask,message",
    [
        (np.array([[0, 300]]), None, r"token ids must be in \[0, 300\), got \[0, 300\]"),
        (np.zeros((1, 65), int), None, "at most the model's context of 64 tokens, got 65"),
        (np.zeros((1, 3), int), np.ones((2, 3)), r"head_mask must have shape \(L, H\)"),
        (np.zeros((1, 3), int), 2 * np.ones((2, 4)), r"head_mask entries must be in \[0, 1\]"),
    ],
)
def test_one_layer_at_a_time_refuses_what_the_whole_forward_refuses(tokens, mask, message):
    module, params, _ = pretrained.load(HF / "gpt2-tiny")
    assert (module.config.num_layers, module.config.num_heads) == (2, 4)
    with pytest.raises(ValueError, match=message):
        next(pretrained.layer_by_layer(module, params, tokens, mask))
