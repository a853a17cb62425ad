"""Running a loaded checkpoint: per-sequence head masks one layer at a time, head
importances of the attention output projection, and token placement on a mesh."""

import jax
import numpy as np
import pytest

from beyondpar import pretrained
from beyondpar.base import parallel
from helpers.paths import DATA

LLAMA = DATA / "hf" / "llama-tiny"  # 2 layers, 4 query heads, 2 kv heads, head_dim 8


@pytest.fixture(scope="module")
def llama():
    module, params, _ = pretrained.load(LLAMA, progress=False)
    return module, params


def test_layer_by_layer_takes_each_sequences_own_head_mask(llama):
    """A (B, L, H) mask gives each sequence its own heads in every layer: one layer at a
    time must equal the whole forward with the same mask, for attention and logits."""
    module, params = llama
    tokens = np.array([[3, 9, 4, 7, 1], [5, 2, 8, 6, 11], [10, 12, 2, 3, 4]], np.int32)
    rng = np.random.default_rng(0)
    mask = rng.uniform(0.0, 1.0, size=(3, 2, 4)).astype(np.float32)
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
