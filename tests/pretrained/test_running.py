"""Running a loaded checkpoint: per-sequence head masks one layer at a time, head
importances of the attention output projection, and token placement on a mesh."""

import jax
import numpy as np
import pytest

from beyondpar import pretrained
from beyondpar.base import parallel
from conftest import DATA

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
