"""The paper's checkpoints load and compute the paper's outputs; orbax round trips."""

import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import checkpoints, model
from helpers.paths import DATA


def heads_of(name):
    return int(name.split("_")[0])


def test_reference_parity(fixture):
    name, _, expected = fixture
    module, params = checkpoints.import_reference(DATA / f"{name}.npz", heads_of(name))
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
    _, params = checkpoints.import_reference(DATA / "4_heads_copy.pt", 4)
    _, from_npz = checkpoints.import_reference(DATA / "4_heads_copy.npz", 4)
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
    _, params = checkpoints.import_reference(path, 4)
    _, from_npz = checkpoints.import_reference(DATA / "4_heads_copy.npz", 4)
    assert calls == ["weights.pth"]
    jax.tree.map(np.testing.assert_array_equal, params, from_npz)


def test_pt_without_torch_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(ImportError, match="4_heads_copy.pt needs the 'torch' package"):
        checkpoints.import_reference(DATA / "4_heads_copy.pt", 4)


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
        checkpoints.import_reference(write_state(tmp_path, state), 4)


def test_wrong_shapes_are_listed(tmp_path):
    state = dict(np.load(DATA / "4_heads_copy.npz"))
    state["layers.1.mlp.2.bias"] = np.zeros(63, np.float32)
    with pytest.raises(
        ValueError, match=r"layers_1.*mlp.*output.*bias.*expected \(64,\), got \(63,\)"
    ):
        checkpoints.import_reference(write_state(tmp_path, state), 4)


def test_bad_paths_and_heads(tmp_path):
    with pytest.raises(FileNotFoundError, match="existing checkpoint file"):
        checkpoints.import_reference(tmp_path / "missing.npz", 4)
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"path must end in .npz, .pt or .pth, got 'x.bin'"):
        checkpoints.import_reference(tmp_path / "x.bin", 4)
    with pytest.raises(ValueError, match="num_heads must divide embed_dim=64, got num_heads=5"):
        checkpoints.import_reference(DATA / "4_heads_copy.npz", 5)


def test_orbax_round_trip(tmp_path):
    state = {"step": jnp.array(3), "params": {"w": jnp.arange(6.0).reshape(2, 3)}}
    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=2)
    for step in (1, 2, 3):
        checkpoints.save(mgr, step, jax.tree.map(lambda x, s=step: x * s, state))
    assert checkpoints.list_steps(tmp_path / "ck") == [2, 3]  # keeps the last 2
    back = checkpoints.restore(mgr, 3, state)
    np.testing.assert_array_equal(back["params"]["w"], 3 * state["params"]["w"])
    assert checkpoints.list_steps(tmp_path / "none") == []


def test_restore_newest_readable_prefers_the_latest_and_skips_damaged(tmp_path):
    """The newest step that verifies is returned; a newer one whose checksum no longer
    matches is skipped and reported, and an older one is never preferred."""
    state = {"w": jnp.arange(4.0)}
    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=5)
    for step in (10, 20, 30):
        checkpoints.save(mgr, step, {"w": state["w"] * step})
    step, back, skipped = checkpoints.restore_newest_readable(mgr, state)
    assert step == 30 and skipped == []
    np.testing.assert_array_equal(back["w"], [0.0, 30.0, 60.0, 90.0])

    sums_path = tmp_path / "ck" / checkpoints.CHECKSUMS
    sums = json.loads(sums_path.read_text())
    assert sorted(sums) == ["10", "20", "30"]
    sums["30"] = "0" * 64  # step 30 no longer matches its recorded checksum
    sums_path.write_text(json.dumps(sums))
    step, back, skipped = checkpoints.restore_newest_readable(mgr, state)
    assert step == 20
    np.testing.assert_array_equal(back["w"], [0.0, 20.0, 40.0, 60.0])
    assert [s for s, _ in skipped] == [30] and "checksum" in skipped[0][1]


def test_set_aside_keeps_every_damaged_copy_of_a_step(tmp_path):
    """A step damaged, saved again and damaged again is set aside under a new name each
    time (step7, step7-2, step7-3), so no earlier copy is overwritten or lost, and the
    manager no longer lists the step."""
    directory = tmp_path / "ck"
    mgr = checkpoints.manager(directory, save_every=1, keep=5)
    targets = []
    for k in (1, 2, 3):
        checkpoints.save(mgr, 7, {"w": jnp.full((3,), float(k))})
        targets.append(checkpoints.set_aside(mgr, 7))
        assert checkpoints.list_steps(directory) == []
    damaged = tmp_path / checkpoints.DAMAGED_DIR
    assert [t.name for t in targets] == ["step7", "step7-2", "step7-3"]
    assert sorted(p.name for p in damaged.iterdir()) == ["step7", "step7-2", "step7-3"]
    # Each copy is its own save: the three folders are distinct and none is empty.
    assert all(any(t.iterdir()) for t in targets)


def test_checksums_keep_only_the_steps_still_on_disk(tmp_path):
    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=2)
    for step in (1, 2, 3):
        checkpoints.save(mgr, step, {"w": jnp.full((2,), float(step))})
    sums = json.loads((tmp_path / "ck" / checkpoints.CHECKSUMS).read_text())
    assert sorted(sums) == ["2", "3"]
    assert sums["3"] == checkpoints.checksum({"w": jnp.full((2,), 3.0)})


def test_a_step_the_manager_does_not_save_gets_no_checksum(tmp_path):
    mgr = checkpoints.manager(tmp_path / "ck", save_every=2, keep=5)
    assert checkpoints.save(mgr, 2, {"w": jnp.full((2,), 2.0)}) is True
    assert checkpoints.save(mgr, 3, {"w": jnp.full((2,), 3.0)}) is False
    assert checkpoints.list_steps(tmp_path / "ck") == [2]
    sums = json.loads((tmp_path / "ck" / checkpoints.CHECKSUMS).read_text())
    assert sums == {"2": checkpoints.checksum({"w": jnp.full((2,), 2.0)})}


def test_load_step_zero_is_step_zero_not_the_latest(tmp_path):
    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=5)
    for step in (0, 5):
        checkpoints.save(mgr, step, {"w": jnp.full((3,), float(step) + 1.0)})
    step, state = checkpoints.load(tmp_path / "ck", 0)
    assert step == 0
    np.testing.assert_array_equal(state["w"], [1.0, 1.0, 1.0])
    step, state = checkpoints.load(tmp_path / "ck")
    assert step == 5
    np.testing.assert_array_equal(state["w"], [6.0, 6.0, 6.0])


def test_checksum_tells_apart_dtypes_with_the_same_bytes():
    as_int = {"w": np.zeros(3, np.int32)}
    as_float = {"w": np.zeros(3, np.float32)}
    assert as_int["w"].tobytes() == as_float["w"].tobytes()
    assert checkpoints.checksum(as_int) != checkpoints.checksum(as_float)
    assert checkpoints.checksum(as_int) == checkpoints.checksum({"w": np.zeros(3, np.int32)})


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", "\udcff"])
def test_an_unreadable_checksums_file_is_said_and_kept_aside_not_overwritten(tmp_path, damage):
    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=5)
    checkpoints.save(mgr, 1, {"w": jnp.ones(2)})
    sums_path = tmp_path / "ck" / checkpoints.CHECKSUMS
    sums_path.write_bytes(damage.encode("utf-8", "surrogateescape"))
    with pytest.warns(UserWarning, match="checksums.json is unreadable.*not verified"):
        back = checkpoints.restore(mgr, 1, {"w": jnp.ones(2)})
    np.testing.assert_array_equal(back["w"], [1.0, 1.0])
    with pytest.warns(UserWarning, match="kept as checksums.json.damaged"):
        checkpoints.save(mgr, 2, {"w": jnp.full((2,), 2.0)})
    aside = sums_path.with_name("checksums.json.damaged")
    assert aside.read_bytes() == damage.encode("utf-8", "surrogateescape")
    assert json.loads(sums_path.read_text()) == {
        "2": checkpoints.checksum({"w": jnp.full((2,), 2.0)})
    }
    assert checkpoints.list_steps(tmp_path / "ck") == [1, 2]


def test_an_empty_checksums_object_is_replaced_without_a_warning(tmp_path, recwarn):
    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=5)
    (tmp_path / "ck").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ck" / checkpoints.CHECKSUMS).write_text("{}")
    checkpoints.save(mgr, 3, {"w": jnp.ones(2)})
    assert not [w for w in recwarn if "checksums" in str(w.message)]
    assert not (tmp_path / "ck" / "checksums.json.damaged").exists()
    assert list(json.loads((tmp_path / "ck" / checkpoints.CHECKSUMS).read_text())) == ["3"]


def test_ctrl_c_during_a_save_lands_once_the_checkpoint_and_its_checksum_are_whole(
    tmp_path, monkeypatch
):
    import os
    import signal

    mgr = checkpoints.manager(tmp_path / "ck", save_every=1, keep=5)
    real_save = mgr.save

    def interrupted_save(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the save starts
        return real_save(*args, **kwargs)

    monkeypatch.setattr(mgr, "save", interrupted_save)
    # Python's own Ctrl-C handler, as in a terminal (a background job may ignore SIGINT).
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            checkpoints.save(mgr, 1, {"w": jnp.ones(2)})
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)
    assert checkpoints.list_steps(tmp_path / "ck") == [1]
    sums = json.loads((tmp_path / "ck" / checkpoints.CHECKSUMS).read_text())
    assert sums == {"1": checkpoints.checksum({"w": jnp.ones(2)})}
    assert [p.name for p in (tmp_path / "ck").iterdir() if "tmp" in p.name] == []
