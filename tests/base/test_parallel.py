"""Mesh helpers: the --mesh flag's grammar and errors, data x model meshes, placing a
host array so that each device receives only its part."""

import platform
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from beyondpar.base import parallel


@pytest.mark.parametrize(
    "text,sizes",
    [
        ("data:2,model:2", {"data": 2, "model": 2}),
        ("model:4", {"data": 1, "model": 4}),
        (" model:2 , data:1", {"data": 1, "model": 2}),
    ],
)
def test_mesh_flag_sizes(text, sizes):
    assert parallel.parse_mesh(text) == sizes


@pytest.mark.parametrize(
    "text", ["data:2,model", "data:0,model:4", "data:2,model:2,data:1", "tensor:2", "", "data:x"]
)
def test_bad_mesh_flags_name_the_flag_the_grammar_and_the_value(text):
    with pytest.raises(ValueError) as err:
        parallel.parse_mesh(text)
    assert str(err.value) == (
        f"--mesh must be data:D,model:M with integers D, M >= 1, got {text!r}"
    )


def test_a_mesh_larger_than_the_machine_is_named():
    with pytest.raises(ValueError, match=r"--mesh data:4,model:2 must use at most the 4 devices"):
        parallel.mesh_from_flag("data:4,model:2")


def test_meshes_lay_devices_out_data_major():
    mesh = parallel.mesh_from_flag("data:2,model:2")
    assert mesh.axis_names == ("data", "model") and mesh.shape == {"data": 2, "model": 2}
    devices = jax.local_devices()
    assert mesh.devices.tolist() == [devices[:2], devices[2:4]]
    assert parallel.model_mesh().devices.ravel().tolist() == [devices[0]]


def test_place_gives_each_device_its_part():
    mesh = parallel.model_mesh(2, 2)
    host = np.arange(32.0).reshape(4, 8)
    array = parallel.place(host, NamedSharding(mesh, P(None, "model")))
    np.testing.assert_array_equal(array, host)
    for shard in array.addressable_shards:
        np.testing.assert_array_equal(shard.data, host[shard.index])
        assert shard.data.shape == (4, 4)
    one = jax.device_put(host, jax.local_devices()[0])
    mesh = parallel.model_mesh()
    same = parallel.place(one, NamedSharding(mesh, P()))
    assert same.unsafe_buffer_pointer() == one.unsafe_buffer_pointer()  # no copy
    assert same.sharding == NamedSharding(mesh, P()) and parallel.mesh_of([same]) is mesh


def test_place_moves_an_array_from_another_device_to_the_one_named():
    devices = jax.local_devices()
    host = np.arange(6.0)
    elsewhere = jax.device_put(host, devices[1])
    placed = parallel.place(elsewhere, NamedSharding(parallel.model_mesh(), P()))
    assert placed.devices() == {devices[0]}
    np.testing.assert_array_equal(placed, host)
    assert elsewhere.devices() == {devices[1]}


@pytest.mark.parametrize("data,model", [(4, 1), (1, 2), (2, 1), (1, 4)])
def test_uneven_meshes_have_the_sizes_asked_for_in_order(data, model):
    mesh = parallel.model_mesh(data, model)
    assert mesh.shape == {"data": data, "model": model}
    devices = jax.local_devices()[: data * model]
    assert mesh.devices.tolist() == [devices[i * model : (i + 1) * model] for i in range(data)]


def test_batches_split_along_data_when_they_divide():
    mesh = parallel.model_mesh(2, 2)
    assert parallel.batch_sharding(mesh, 6).spec == P("data")
    assert parallel.batch_sharding(mesh, 5).spec == P()
    assert parallel.mesh_of({"a": jax.device_put(np.ones(4), NamedSharding(mesh, P()))}) is mesh
    assert parallel.mesh_of({"a": np.ones(4)}) is None


def test_a_local_mesh_needs_a_batch_of_at_least_one_item_per_device():
    """A batch as large as the device count still splits (one item each); a smaller one
    stays on one device."""
    count = len(jax.local_devices())
    assert count >= 2  # the tests' CPU devices
    assert parallel.local_mesh().size == count
    assert parallel.local_mesh(count).size == count
    assert parallel.local_mesh(count - 1) is None


@pytest.mark.parametrize("leading", [4, 8, 6, 3])
def test_independent_problems_split_over_devices_only_when_they_divide(leading):
    """Split along the first axis, one equal block per device, when the device count
    divides it; otherwise the array is returned as it came (same buffer, same device)."""
    count = len(jax.local_devices())
    host = np.arange(leading * 6, dtype=np.float32).reshape(leading, 2, 3)
    one = jax.device_put(host, jax.local_devices()[0])
    split = parallel.split_first_axis(one)
    np.testing.assert_array_equal(split, host)
    if leading % count:
        assert split is one
    else:
        assert split.sharding.spec == P("data") and len(split.sharding.device_set) == count
        shapes = {s.data.shape for s in split.addressable_shards}
        assert shapes == {(leading // count, 2, 3)}


@pytest.mark.parametrize("leading", [8, 5])
def test_host_batches_become_device_arrays_split_when_they_divide(leading):
    """A host batch is split like independent problems (one block per device) when the
    device count divides it, else it is one array on the default device."""
    count = len(jax.local_devices())
    host = np.arange(leading * 3, dtype=np.int32).reshape(leading, 3)
    placed = parallel.split_over_devices(host)
    assert isinstance(placed, jax.Array)
    np.testing.assert_array_equal(placed, host)
    if leading % count:
        assert placed.devices() == {jax.devices()[0]}
    else:
        assert placed.sharding.spec == P("data") and len(placed.sharding.device_set) == count
        assert {s.data.shape for s in placed.addressable_shards} == {(leading // count, 3)}


def test_one_device_has_nothing_to_split(monkeypatch):
    """A process with a single device has no local mesh, and independent problems stay
    where they are, whatever their count."""
    device = jax.local_devices()[0]
    monkeypatch.setattr(jax, "local_devices", lambda: [device])
    assert parallel.local_mesh() is None and parallel.local_mesh(8) is None
    one = jax.device_put(np.ones((4, 3), np.float32), device)
    assert parallel.split_first_axis(one) is one
    placed = parallel.split_over_devices(np.ones((4, 3), np.float32))
    assert placed.devices() == {device}


def test_one_process_without_a_coordinator_stays_local(monkeypatch):
    calls = []
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args: calls.append(args))
    monkeypatch.setattr(jax.config, "update", lambda *args: calls.append(args))
    assert parallel.initialize() is False
    assert parallel.initialize("localhost:1234", 1, 0) is False
    assert calls == []


def test_a_coordinator_in_the_environment_joins_with_its_settings(monkeypatch):
    calls = []
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args: calls.append(args))
    monkeypatch.setattr(jax.config, "update", lambda *args: calls.append(args))
    assert parallel.initialize() is True
    assert calls == [("jax_cpu_collectives_implementation", "gloo"), ()]


@pytest.mark.parametrize(
    "address,ok",
    [
        ("localhost:1234", True),
        ("10.0.0.1:65535", True),
        ("[::1]:1234", True),
        ("[fe80::1]:8476", True),
        (":1234", False),
        ("h:0", False),
        ("h:65536", False),
        ("h:-1", False),
        ("localhost", False),
        ("[::1]", False),
        ("[fe80::1", False),
        ("::1", False),
        ("fe80::1", False),
        ("[h]]:1", False),
        ("[]:1", False),
        ("host:\uff11\uff12", False),
    ],
)
def test_a_coordinator_address_is_a_host_and_a_port_number(address, ok, monkeypatch):
    """Only host:port (an IPv6 host in brackets) reaches jax.distributed; anything else
    is refused before it could wait on a coordinator that cannot exist."""
    calls = []
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args: calls.append(args))
    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    assert parallel._is_host_and_port(address) is ok
    if ok:
        assert parallel.initialize(address, 2, 1) is True
        assert calls == [(address, 2, 1)]
    else:
        with pytest.raises(
            ValueError, match=re.escape(f"host:port when num_processes=2 > 1, got {address!r}")
        ):
            parallel.initialize(address, 2, 1)
        assert calls == []


# Faults while filling a 64 MB malloc buffer for the second time, after the entry points'
# setup (one per 4 KB page, 16,384, when its pages are new). A fresh interpreter: the
# allocator setting is process-wide and JAX's devices are set before its first use.
SECOND_FILL_AFTER_SETUP = """
import ctypes, resource
from beyondpar.base import parallel
parallel.use_all_cpu_cores()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def fill():
    buffer = libc.malloc(64 * 2**20)
    ctypes.memset(buffer, 1, 64 * 2**20)
    libc.free(buffer)
fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_using_all_cores_also_keeps_freed_memory_for_reuse():
    """After `use_all_cpu_cores`, a large buffer freed and allocated again reuses its pages
    instead of faulting on each one afresh."""
    out = subprocess.run(
        [sys.executable, "-c", SECOND_FILL_AFTER_SETUP], capture_output=True, text=True, check=True
    )
    assert int(out.stdout.split()[-1]) < 1_000
