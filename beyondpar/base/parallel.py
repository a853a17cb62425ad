"""Devices and meshes: one 1-D `data` mesh over every device of every process, and 2-D
`data` x `model` meshes for models larger than one device.

Data parallelism is `jax.jit` with `NamedSharding`: parameters replicated, the batch
split along `data`. Several processes (hosts) run the same code after
`jax.distributed.initialize`. A `data` x `model` mesh also splits each parameter along
`model` (heads, features) as its `PartitionSpec` says; XLA places the collectives.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from beyondpar.base import allocator

DATA = "data"
MODEL = "model"

# JAX logs at INFO that it found no TPU on every CPU machine; not news to our users.
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def use_all_cpu_cores(batch_size: int | None = None) -> int:
    """Expose one CPU device per core, so data-parallel code also spreads over CPU cores.

    With `batch_size`, the most cores that divide it (a batch of 50 on 4 cores uses 2).
    Must run before JAX creates its backends (first array or device query); entry points
    call it at start. It also keeps freed memory for reuse (`allocator`): large temporaries
    are then not mapped afresh by every call. Returns the number of CPU devices asked for.
    """
    allocator.keep_freed_memory()
    count = cpu_device_count(os.cpu_count() or 1, batch_size)
    jax.config.update("jax_num_cpu_devices", count)
    return count


def cpu_device_count(cores: int, batch_size: int | None = None) -> int:
    """The most devices, at most one per core, that split `batch_size` evenly."""
    return max(d for d in range(1, cores + 1) if batch_size is None or batch_size % d == 0)


def initialize(coordinator_address: str = "", num_processes: int = 1, process_id: int = 0) -> bool:
    """Join a multi-process run when asked to by the arguments or by the environment.

    Returns True when running distributed. On CPU, collectives go through gloo.
    """
    from_env = bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
    if num_processes <= 1 and not from_env:
        return False
    if jax.distributed.is_initialized():  # a second run in the same processes
        return True
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if num_processes > 1:
        if not _is_host_and_port(coordinator_address):
            raise ValueError(
                "distributed.coordinator_address must be host:port when "
                f"num_processes={num_processes} > 1, got {coordinator_address!r}"
            )
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    else:
        jax.distributed.initialize()
    return True


def _is_host_and_port(address: str) -> bool:
    """Whether `address` is host:port with a port number (IPv6 hosts in brackets)."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") or ":" in host:  # IPv6: only in brackets, then the port
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else ""
        host = "" if "[" in inner or "]" in inner else inner
    return bool(host) and port.isascii() and port.isdigit() and 0 < int(port) < 65536


def data_mesh(devices=None) -> jax.sharding.Mesh:
    """`devices` (default: all devices of all processes) on one `data` axis.

    The axis is Auto: the compiler places the few collectives data parallelism needs.
    """
    devices = jax.devices() if devices is None else list(devices)
    return jax.make_mesh(
        (len(devices),), (DATA,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
    )


def local_mesh(batch_size: int | None = None) -> jax.sharding.Mesh | None:
    """The `data` mesh of this process's devices, or None when there is one device or
    fewer items in `batch_size` than devices (nothing to split)."""
    devices = jax.local_devices()
    if len(devices) < 2 or (batch_size is not None and batch_size < len(devices)):
        return None
    return data_mesh(devices)


def split_over_devices(batch):
    """A host batch split along its first axis over the local devices when that divides
    evenly (so each device's work stays on it), else one array on the default device."""
    return jax.numpy.asarray(split_first_axis(np.asarray(batch)))


def split_first_axis(array):
    """`array` split along its first axis over the local devices when there are several
    and it divides evenly (independent problems, e.g. layers: each device then works on
    its own and nothing moves between devices), else unchanged."""
    mesh = local_mesh()
    if mesh is None or array.shape[0] % mesh.size:
        return array
    return jax.device_put(array, batch_sharded(mesh))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharded(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA))


def check_batch_size(batch_size: int, mesh) -> None:
    if batch_size % mesh.size:
        raise ValueError(
            f"optim.batch_size must be divisible by the device count {mesh.size}, got {batch_size}"
        )


def shard_batch(global_batch: np.ndarray, mesh) -> jax.Array:
    """A global host array (identical on every process) as a batch split over `data`."""
    return jax.make_array_from_callback(
        global_batch.shape, batch_sharded(mesh), lambda index: global_batch[index]
    )


def is_main_process() -> bool:
    return jax.process_index() == 0


# ------------------------------------------------------------ data x model meshes


def parse_mesh(text: str, flag: str = "--mesh") -> dict[str, int]:
    """{"data": D, "model": M} of 'data:D,model:M' (either part may be left out: 1)."""
    expected = f"{flag} must be data:D,model:M with integers D, M >= 1"
    sizes = {DATA: 1, MODEL: 1}
    seen = set()
    for part in text.split(","):
        name, _, value = part.strip().partition(":")
        if name not in sizes or name in seen or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"{expected}, got {text!r}")
        seen.add(name)
        sizes[name] = int(value)
    return sizes


def model_mesh(data: int = 1, model: int = 1, devices=None, name="mesh") -> jax.sharding.Mesh:
    """A `data` x `model` mesh over the first data * model of `devices` (default: this
    process's devices); 1 x 1 is one device, the same code path as any other."""
    devices = jax.local_devices() if devices is None else list(devices)
    if data * model > len(devices):
        raise ValueError(
            f"{name} data:{data},model:{model} must use at most the {len(devices)} devices "
            f"available, got {data * model}"
        )
    grid = np.asarray(devices[: data * model], dtype=object).reshape(data, model)
    return jax.sharding.Mesh(grid, (DATA, MODEL))


def mesh_from_flag(text: str, flag: str = "--mesh") -> jax.sharding.Mesh:
    """The mesh a 'data:D,model:M' flag asks for; errors name the flag."""
    sizes = parse_mesh(text, flag)
    return model_mesh(sizes[DATA], sizes[MODEL], name=flag)


def mesh_of(tree) -> jax.sharding.Mesh | None:
    """The mesh the leaves of `tree` are laid out on (that of the first leaf with a
    NamedSharding), or None when none is on one."""
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def batch_sharding(mesh, batch_size: int) -> NamedSharding:
    """Split along `data` when the batch divides evenly, else replicated on `mesh`."""
    split = batch_size % mesh.shape[DATA] == 0
    return NamedSharding(mesh, P(DATA) if split else P())


def place(values, sharding) -> jax.Array:
    """A host array (NumPy, or a jax.Array on a CPU device) as a jax.Array laid out by
    `sharding`: each device receives only its part, never the whole array first. An
    array already on the one device `sharding` names keeps its buffer (no copy)."""
    devices = sharding.device_set
    if len(devices) == 1 and isinstance(values, jax.Array) and values.devices() == devices:
        return jax.make_array_from_single_device_arrays(values.shape, sharding, [values])
    host = np.asarray(values)  # a view of a CPU buffer, not a copy
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
