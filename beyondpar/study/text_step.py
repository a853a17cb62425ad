"""The language model's jitted steps: next-token loss over windows of T + 1 tokens
(inputs the first T, targets the last T), gradients accumulated over microbatches, the
update, and held-out loss sums.

Parameters stay float32; with a bfloat16 compute dtype the forward and backward passes
run on a bfloat16 copy of them and the loss is taken from float32 logits, so the update
and the optimiser state keep full precision.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax import flatten_util
from jax.sharding import PartitionSpec as P

from beyondpar.base import parallel
from beyondpar.study import train


def resolve_dtype(name: str, platform: str):
    """`compute_dtype` as a dtype: "auto" is bfloat16 on accelerators, float32 on CPU."""
    if name == "auto":
        name = "float32" if platform == "cpu" else "bfloat16"
    return jnp.dtype(name)


def window_loss_sums(module, params, windows_BxT1, dtype=jnp.float32, train_key=None):
    """(summed next-token cross-entropy in nats, token count) of windows (B, T + 1): in
    training mode with `train_key` (dropout's stream; training mode also without dropout,
    whose attention has a cheaper gradient), in evaluation mode without."""
    if dtype != jnp.float32:
        params = jax.tree.map(lambda p: p.astype(dtype), params)
    inputs, targets = windows_BxT1[:, :-1], windows_BxT1[:, 1:]
    deterministic = train_key is None
    rngs = None if deterministic else {"dropout": train_key}
    logits = module.apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return jnp.sum(ce), jnp.asarray(ce.size, jnp.float32)


def accumulated_gradients(loss_fn, params, windows_BxT1, microbatches: int):
    """(mean of `loss_fn` over the slices, mean of its gradients): `windows` split into
    `microbatches` equal slices along the batch, run one after another in a `lax.scan`,
    so only one slice's activations are alive at a time. `loss_fn(params, slice, i)` is
    each slice's mean loss; equal slices make the mean of means the whole batch's mean."""
    if microbatches == 1:
        return jax.value_and_grad(loss_fn)(params, windows_BxT1, 0)
    b = windows_BxT1.shape[0]
    slices = windows_BxT1.reshape(microbatches, b // microbatches, *windows_BxT1.shape[1:])
    zeros = jax.tree.map(jnp.zeros_like, params)

    def body(carry, item):
        index, piece = item
        loss, grads = jax.value_and_grad(loss_fn)(params, piece, index)
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

    init = (jnp.zeros((), jnp.float32), zeros)
    (loss, grads), _ = jax.lax.scan(body, init, (jnp.arange(microbatches), slices))
    return jax.tree.map(lambda x: x / microbatches, (loss, grads))


def sharded_gradients(module, mesh, microbatches: int, dtype):
    """(params, windows, key) -> (mean loss, gradients) over the whole batch: each device
    takes its shard of `data`, accumulates over its microbatches, and the gradients are
    summed in one all-reduce of a flat vector (as `train.sharded_loss_and_gradients`)."""
    shard_module = module.clone(data_axis=parallel.DATA)
    devices = mesh.shape[parallel.DATA]

    def on_shard(params, windows, key):
        def slice_loss(p, piece, index):
            slice_key = jax.random.fold_in(key, index)
            total, count = window_loss_sums(shard_module, p, piece, dtype, slice_key)
            return total / (count * devices)

        loss, grads = accumulated_gradients(slice_loss, params, windows, microbatches)
        flat, unflatten = flatten_util.ravel_pytree(grads)
        return jax.lax.psum(loss, parallel.DATA), unflatten(jax.lax.psum(flat, parallel.DATA))

    specs = dict(in_specs=(P(), P(parallel.DATA), P()), out_specs=(P(), P()))
    return jax.shard_map(on_shard, mesh=mesh, check_vma=False, **specs)


@functools.lru_cache(maxsize=16)
def jitted_update(module, tx, mesh, microbatches: int, dtype_name: str, windows_shape=None):
    """(state, windows, dropout key) -> (state, {loss, grad_norm}); the state donated.
    The gradient norm is before clipping (what the clip acted on). `windows_shape` (B,
    T + 1) of a `model.Transformer`'s batches packs the step's temporaries into blocks
    that the CPU device threads' heaps keep mapped (`allocator.bounded_temporaries`):
    packed whole, at 8 and 16 heads of the cpu size, every step faulted its pages in
    afresh and took 1.56x as long."""
    dtype = jnp.dtype(dtype_name)
    gradients = sharded_gradients(module, mesh, microbatches, dtype)

    def step_fn(state, windows, dropout_key):
        key = jax.random.fold_in(dropout_key, state["step"])
        loss, grads = gradients(state["params"], windows, key)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new = {"step": state["step"] + 1, "params": params, "opt_state": opt_state}
        return new, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    repl, data = parallel.replicated(mesh), parallel.batch_sharded(mesh)
    options = {}
    if windows_shape is not None:
        sequences = -(-windows_shape[0] // (mesh.shape[parallel.DATA] * microbatches))
        options = train.step_compiler_options(module.config, mesh, sequences, windows_shape[1] - 1)
    return jax.jit(
        step_fn,
        donate_argnums=0,
        in_shardings=(repl, data, repl),
        out_shardings=(repl, repl),
        compiler_options=options,
    )


def window_nats(module, params, windows_BxT1, dtype=jnp.float32):
    """Each window's summed next-token cross-entropy in nats (B,), in eval mode."""
    if dtype != jnp.float32:
        params = jax.tree.map(lambda p: p.astype(dtype), params)
    logits = module.apply({"params": params}, windows_BxT1[:, :-1], deterministic=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), windows_BxT1[:, 1:]
    )
    return jnp.sum(ce, axis=-1)


@functools.lru_cache(maxsize=16)
def jitted_window_nats(module, mesh, dtype_name: str):
    """(params, windows) -> `window_nats`, the windows split over `data` and the nats
    gathered onto every device: in a multi-process run each process then reads them all
    (a result left split would span devices no one process can fetch)."""
    dtype = jnp.dtype(dtype_name)
    repl, data = parallel.replicated(mesh), parallel.batch_sharded(mesh)
    return jax.jit(
        lambda params, windows: window_nats(module, params, windows, dtype),
        in_shardings=(repl, data),
        out_shardings=repl,
    )
