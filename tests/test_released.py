"""The paper's released weights load and compute the paper's outputs; bad files, keys
and shapes are named."""

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import checkpoints, model, released
from helpers.paths import DATA


def test_import_reference_is_also_where_users_look():
    assert checkpoints.import_reference is released.import_reference


def heads_of(name):
    return int(name.split("_")[0])


def test_reference_parity(fixture):
    name, _, expected = fixture
    module, params = released.import_reference(DATA / f"{name}.npz", heads_of(name))
    logits, attn = model.apply_with_attention(module, params, jnp.asarray(expected["tokens"]))
    np.testing.assert_allclose(logits, expected["logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(attn, expected["attention"], atol=1e-5, rtol=0)
    assert model.count_params(params) == 172_800


class FakeTensor:
    def __init__(self, array):
        self.array = array

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.array


def test_pt_goes_through_torch_load(monkeypatch):
    """A .pt file is read with torch.load(map_location='cpu', weights_only=True)."""
    calls = []

    def load(path, map_location, weights_only):
        calls.append((path.name, map_location, weights_only))
        with np.load(DATA / "4_heads_copy.npz") as data:
            return {k: FakeTensor(data[k]) for k in data.files}

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
    _, params = released.import_reference(DATA / "4_heads_copy.pt", 4)
    _, from_npz = released.import_reference(DATA / "4_heads_copy.npz", 4)
    assert calls == [("4_heads_copy.pt", "cpu", True)]
    jax.tree.map(np.testing.assert_array_equal, params, from_npz)


def test_pth_is_read_like_pt(tmp_path, monkeypatch):
    calls = []

    def load(path, map_location, weights_only):
        calls.append(path.name)
        with np.load(DATA / "4_heads_copy.npz") as data:
            return {k: FakeTensor(data[k]) for k in data.files}

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
    path = tmp_path / "weights.pth"
    path.write_bytes(b"")
    _, params = released.import_reference(path, 4)
    _, from_npz = released.import_reference(DATA / "4_heads_copy.npz", 4)
    assert calls == ["weights.pth"]
    jax.tree.map(np.testing.assert_array_equal, params, from_npz)


def test_pt_without_torch_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(ImportError, match="4_heads_copy.pt needs the 'torch' package"):
        released.import_reference(DATA / "4_heads_copy.pt", 4)


def write_state(tmp_path, state):
    path = tmp_path / "ckpt.npz"
    np.savez(path, **state)
    return path


def test_wrong_keys_are_listed(tmp_path):
    state = dict(np.load(DATA / "4_heads_copy.npz"))
    state.pop("layers.2.ln1.weight")
    state["layers.0.attn.extra"] = np.zeros(3, np.float32)
    with pytest.raises(
        ValueError,
        match=r"missing \['layers.2.ln1.weight'\], unexpected \['layers.0.attn.extra'\]",
    ):
        released.import_reference(write_state(tmp_path, state), 4)


def test_wrong_shapes_are_listed(tmp_path):
    state = dict(np.load(DATA / "4_heads_copy.npz"))
    state["layers.1.mlp.2.bias"] = np.zeros(63, np.float32)
    with pytest.raises(
        ValueError, match=r"layers_1.*mlp.*output.*bias.*expected \(64,\), got \(63,\)"
    ):
        released.import_reference(write_state(tmp_path, state), 4)


def test_bad_paths_and_heads(tmp_path):
    with pytest.raises(FileNotFoundError, match="existing checkpoint file"):
        released.import_reference(tmp_path / "missing.npz", 4)
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"path must end in .npz, .pt or .pth, got 'x.bin'"):
        released.import_reference(tmp_path / "x.bin", 4)
    with pytest.raises(ValueError, match="num_heads must divide embed_dim=64, got num_heads=5"):
        released.import_reference(DATA / "4_heads_copy.npz", 5)
