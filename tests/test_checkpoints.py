"""Run checkpoints: orbax round trips, checksums, damaged steps and interrupted saves."""

import json
import sys
import threading
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import checkpoints


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


class _State(typing.NamedTuple):
    step: np.ndarray
    params: dict


def test_checksum_is_the_same_for_a_named_tuple_read_back_as_a_dict():
    """A state saved as a named tuple (fields in their own order: step, params) and read
    back as a dict (keys sorted: params, step) hashes the same."""
    params = {"w": np.arange(3.0, dtype=np.float32)}
    as_tuple = _State(np.int32(7), params)
    as_dict = {"step": np.int32(7), "params": params}
    assert checkpoints.checksum(as_tuple) == checkpoints.checksum(as_dict)
    assert checkpoints.checksum(as_tuple) != checkpoints.checksum(as_tuple._replace(step=8))


class _ScriptedManager:
    """A checkpoint manager whose restore runs `read` (returning the state or raising as
    an orbax read does), in a folder with no recorded checksums."""

    def __init__(self, directory, read):
        self.directory, self._read = directory, read

    def restore(self, step, args):
        return self._read()


def test_a_read_good_or_failed_gives_back_the_hooks_and_stderr_it_found(tmp_path):
    found = sys.unraisablehook, threading.excepthook, sys.stderr
    assert checkpoints.restore(_ScriptedManager(tmp_path, lambda: {"w": 1}), 4, {}) == {"w": 1}
    assert (sys.unraisablehook, threading.excepthook, sys.stderr) == found

    def failing():
        raise OSError("disk gone")

    with pytest.raises(checkpoints.CheckpointError, match="step 4 is unreadable: OSError"):
        checkpoints.restore(_ScriptedManager(tmp_path, failing), 4, {})
    assert (sys.unraisablehook, threading.excepthook, sys.stderr) == found


def test_a_failed_read_swallows_the_reports_of_its_abandoned_reads_that_come_later(tmp_path):
    """Orbax's abandoned reads report from their threads after the exception: one 0.95 s
    later (later than the wait's quiet time, within its settle time) never reaches the
    program's hook."""
    late, hook = [], sys.unraisablehook

    def abandoned_read():
        time.sleep(0.95)
        sys.unraisablehook("Event loop is closed")  # whichever hook is in place by then

    reads = [threading.Thread(target=abandoned_read)]

    def failing():
        reads[0].start()
        raise ValueError("OUT_OF_RANGE: cut short")

    sys.unraisablehook = late.append
    try:
        with pytest.raises(checkpoints.CheckpointError, match="step 2 is unreadable"):
            checkpoints.restore(_ScriptedManager(tmp_path, failing), 2, {})
        reads[0].join()
    finally:
        sys.unraisablehook = hook
    assert late == []


def test_an_error_of_several_lines_is_named_by_its_type_and_first_line(tmp_path):
    def failing():
        raise ValueError("tree structures do not match:\n  a: ...\nIf intentional, pass ...")

    with pytest.raises(checkpoints.CheckpointError) as err:
        checkpoints.restore(_ScriptedManager(tmp_path, failing), 5, {})
    assert str(err.value) == "step 5 is unreadable: ValueError: tree structures do not match:"
