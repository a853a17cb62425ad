"""Training: `train_and_evaluate(config, workdir)`.

A run is a pure function of its config: the training set is drawn once from the task
with the config's seed, and the batch order and dropout key of update `s` are functions
of (seed, s) alone, so a run that is interrupted and resumed from a checkpoint ends with
exactly the parameters of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from jax import flatten_util
from jax.sharding import PartitionSpec as P

from beyondpar import batches, checkpoints, tasks
from beyondpar import model as model_lib
from beyondpar.base import allocator, files, locks, parallel
from beyondpar.study import config_lib
from beyondpar.study import workdir as workdir_lib
from beyondpar.study.workdir import CHECKPOINT_DIR, METRICS_FILE

# ---------------------------------------------------------------- data


def keys(seed: int) -> dict[str, jax.Array]:
    """Independent streams: init, training data, eval data, shuffling, dropout."""
    root = jax.random.PRNGKey(seed)
    names = ("init", "train_data", "eval_data", "shuffle", "dropout")
    return {name: jax.random.fold_in(root, i) for i, name in enumerate(names)}


@dataclasses.dataclass
class Dataset:
    """Host copy of a task's examples; `batch(step)` is a function of (seed, step)."""

    examples: tasks.Examples
    batch_size: int
    shuffle_key: jax.Array
    _orders: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def steps_per_epoch(self) -> int:
        return self.examples.inputs.shape[0] // self.batch_size

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            n = self.examples.inputs.shape[0]
            key = jax.random.fold_in(self.shuffle_key, epoch)
            self._orders = {epoch: np.asarray(jax.random.permutation(key, n))}
        return self._orders[epoch]

    def indices(self, step: int) -> np.ndarray:
        epoch, i = divmod(step, self.steps_per_epoch)
        return self._order(epoch)[i * self.batch_size : (i + 1) * self.batch_size]

    def batch(self, step: int) -> tasks.Examples:
        idx = self.indices(step)
        return tasks.Examples(*(np.asarray(a)[idx] for a in self.examples))


def total_steps(config: ml_collections.ConfigDict) -> int:
    """Updates in a whole run: full batches per epoch times epochs."""
    return (config.task.num_train // config.optim.batch_size) * config.optim.num_epochs


def make_datasets(config: ml_collections.ConfigDict) -> tuple[Dataset, tasks.Examples]:
    t, k = config.task, keys(config.seed)
    make = functools.partial(
        tasks.make_examples,
        t.name,
        seq_len=t.seq_len,
        vocab_size=config.model.vocab_size,
        lag=t.lag,
    )
    train = make(k["train_data"], t.num_train)
    evaluation = make(k["eval_data"], t.num_eval)
    as_np = lambda ex: tasks.Examples(*(np.asarray(a) for a in ex))
    return Dataset(as_np(train), config.optim.batch_size, k["shuffle"]), as_np(evaluation)


# ---------------------------------------------------------------- steps


def create_state(module: model_lib.Transformer, key, tx, seq_len: int) -> dict:
    return state_of(model_lib.init_params(module, key, seq_len), tx)


def state_of(params, tx) -> dict:
    """The training state at step 0 of `params` under the optimiser `tx`."""
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}


def loss_and_accuracy(logits, batch: tasks.Examples, weights=None):
    """Mean cross-entropy over all positions (the paper) and the accuracy sums."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.targets)
    w = jnp.ones(ce.shape[0], ce.dtype) if weights is None else weights
    correct = (jnp.argmax(logits, -1) == batch.targets).astype(ce.dtype)
    # Sums of 0/1 weights times counts: exact in float32, whatever the order of addition.
    hits, count = batches.predictable_hits(logits, batch, axis=-1)
    return {
        "loss_sum": jnp.sum(w[:, None] * ce),
        "tokens": jnp.sum(w) * ce.shape[1],
        "correct": jnp.sum(w[:, None] * correct),
        "correct_predictable": jnp.sum(w * hits.astype(ce.dtype)),
        "predictable": jnp.sum(w * count.astype(ce.dtype)),
    }


def adam(learning_rate: float) -> optax.GradientTransformation:
    """The paper's optimiser, one object per learning rate: runs with the same model and
    learning rate then share one compiled update (see `make_train_step`)."""
    return _adam(float(learning_rate))


@functools.cache
def _adam(learning_rate: float) -> optax.GradientTransformation:
    return optax.adam(learning_rate)


def make_train_step(module, tx, mesh, dropout_key, batch_shape: tuple[int, int]):
    """Jitted update: parameters replicated, the batch of `batch_shape` (sequences, tokens)
    split over the `data` axis. Steps made for the same (module, tx, mesh, batch_shape)
    share one compiled program: every run of a grid with the same model, and every resume,
    compiles it once per process."""
    update = jitted_update(module, tx, mesh, tuple(batch_shape))
    return lambda state, batch: update(state, batch, dropout_key)


# A step compiled with several temporary blocks cannot be written to JAX's persistent
# compilation cache (XLA serialises one block only): with the cache on, JAX would warn at
# every compilation of the step. It is compiled once per process, for thousands of calls.
warnings.filterwarnings(
    "ignore",
    message=r"Error writing persistent compilation cache entry for 'jit_step_fn'.*"
    r"Multiple temp buffer allocations",
    category=UserWarning,
)


@functools.lru_cache(maxsize=32)
def jitted_update(module, tx, mesh, batch_shape: tuple[int, int]):
    """The jitted (state, batch, dropout_key) -> (state, loss) of `make_train_step`, for
    work that inspects its compiled program (a profile of the step). `batch_shape`
    (sequences, tokens) sizes the blocks its temporaries are packed into
    (`allocator.bounded_temporaries`)."""
    loss_and_gradients = sharded_loss_and_gradients(module, mesh)

    def step_fn(state, batch: tasks.Examples, dropout_key):
        key = jax.random.fold_in(dropout_key, state["step"])
        loss, grads = loss_and_gradients(state["params"], batch, key)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, loss

    repl, data = parallel.replicated(mesh), parallel.batch_sharded(mesh)
    shardings = dict(in_shardings=(repl, data, repl), out_shardings=(repl, repl))
    # Temporaries in blocks that the device threads' heaps keep mapped between steps.
    sequences, tokens = batch_shape
    options = step_compiler_options(module.config, mesh, -(-sequences // mesh.size), tokens)
    return jax.jit(step_fn, donate_argnums=0, compiler_options=options, **shardings)


def step_compiler_options(cfg, mesh, sequences: int, tokens: int) -> dict:
    """`jax.jit` options of a training step whose devices each run `sequences` sequences
    of `tokens` tokens at a time: temporaries in blocks that the device threads' heaps
    keep mapped between steps (`allocator.bounded_temporaries`, CPU only)."""
    largest = largest_tensor_bytes(cfg, sequences, tokens)
    return allocator.bounded_temporaries(largest, mesh.devices.flat[0].platform)


def sharded_loss_and_gradients(module, mesh):
    """(params, batch, dropout key) -> (mean loss, its gradients) over the whole batch,
    each device working on its shard of `data` and the gradients summed in one
    all-reduce of a single flat vector. Left to the compiler, the sum is one all-reduce
    of every parameter's array, which XLA's CPU collectives run array by array, one
    rendezvous each (61 arrays: a tenth of a 1-head step on 2 cores). Dropout masks are
    the whole batch's (`model.Dropout`), so the step is the same on any number of
    devices."""
    shard_module = module.clone(data_axis=parallel.DATA)
    devices = mesh.shape[parallel.DATA]

    def shard_loss(params, batch, key):
        logits = shard_module.apply(
            {"params": params}, batch.inputs, deterministic=False, rngs={"dropout": key}
        )
        sums = loss_and_accuracy(logits, batch)
        return sums["loss_sum"] / (sums["tokens"] * devices)

    def on_shard(params, batch, key):
        loss, grads = jax.value_and_grad(shard_loss)(params, batch, key)
        flat, unflatten = flatten_util.ravel_pytree(grads)
        return jax.lax.psum(loss, parallel.DATA), unflatten(jax.lax.psum(flat, parallel.DATA))

    specs = dict(in_specs=(P(), P(parallel.DATA), P()), out_specs=(P(), P()))
    # Unchecked: each shard's gradients are its own partial sums until the one `psum`
    # (checked, JAX would sum every replicated parameter's gradient where it is made).
    return jax.shard_map(on_shard, mesh=mesh, check_vma=False, **specs)


def largest_tensor_bytes(cfg: model_lib.ModelConfig, batch_size: int, seq_len: int) -> int:
    """Bytes of the largest float32 tensor a training step of `batch_size` sequences of
    `seq_len` tokens holds: activations (attention probabilities B x H x T x T, logits
    B x T x V, MLP B x T x F) or a parameter's gradient and optimiser moments (the V x D
    embedding and head, the F x D MLP weights, the positions' max_len x D)."""
    d, t = cfg.embed_dim, seq_len
    activation = batch_size * t * max(cfg.num_heads * t, cfg.vocab_size, cfg.mlp_dim, d)
    parameter = d * max(cfg.vocab_size, cfg.mlp_dim, cfg.max_len, d)
    return 4 * max(activation, parameter)


@functools.lru_cache(maxsize=32)
def make_eval_step(module, mesh):
    """Jitted loss and accuracy sums; one compiled program per (module, mesh)."""

    def eval_fn(params, batch, weights):
        logits = module.apply({"params": params}, batch.inputs, deterministic=True)
        return loss_and_accuracy(logits, batch, weights)

    repl, data = parallel.replicated(mesh), parallel.batch_sharded(mesh)
    return jax.jit(eval_fn, in_shardings=(repl, data, data), out_shardings=repl)


def evaluate_split(eval_step, params, examples: tasks.Examples, batch_size: int, mesh) -> dict:
    """Loss and accuracies over a whole split; the last batch is padded with weight 0."""
    n = examples.inputs.shape[0]
    totals = None
    for start in range(0, n, batch_size):
        idx = np.arange(start, start + batch_size)
        weights = (idx < n).astype(np.float32)
        idx = np.minimum(idx, n - 1)
        batch = tasks.Examples(*(parallel.shard_batch(np.asarray(a)[idx], mesh) for a in examples))
        sums = eval_step(params, batch, parallel.shard_batch(weights, mesh))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.device_get(totals)
    return {
        "loss": float(totals["loss_sum"] / totals["tokens"]),
        "accuracy": float(totals["correct"] / totals["tokens"]),
        "accuracy_predictable": float(totals["correct_predictable"] / totals["predictable"]),
    }


# ---------------------------------------------------------------- the loop


def _logged_step(line: str) -> float:
    """The step of a metrics line; a torn or foreign line counts as after any step."""
    try:
        return float(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return float("inf")


class MetricsWriter:
    """JSON lines, one per logged step, from process 0 only."""

    def __init__(self, path: Path, active: bool):
        self.path, self.active = path, active

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after `step` (by a run killed before its next checkpoint)."""
        if not (self.active and self.path.exists()):
            return
        kept = [ln for ln in self.path.read_text().splitlines() if _logged_step(ln) <= step]
        files.write_text(self.path, "".join(f"{ln}\n" for ln in kept))

    def write(self, step: int, values: dict) -> None:
        if self.active:
            files.append_json_line(self.path, {"step": step, **values})


def check_finite(pending: list[tuple[int, jax.Array]], last_saved: int | None) -> list[float]:
    losses = [float(loss) for _, loss in pending]
    for (step, _), loss in zip(pending, losses, strict=True):
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"training loss is {loss} at step {step}; stopped, {_last_good(last_saved)}"
            )
    return losses


def _last_good(last_saved: int | None) -> str:
    if last_saved is None:
        return "no checkpoint saved yet"
    return f"the last good checkpoint is step {last_saved}"


def all_finite(state) -> bool:
    """Whether every float of the (replicated) state is finite, checked on the host from
    this process's copy: the state is a few MB, and a jitted check of its hundreds of
    leaves took longer to compile (1-3 s per run) than the host takes to read them."""
    return all(
        np.isfinite(np.asarray(x.addressable_data(0))).all()
        for x in jax.tree.leaves(state)
        if jnp.issubdtype(x.dtype, jnp.floating)
    )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Train (or resume) the run of `config` in `workdir`; returns the final state.

    The workdir is locked for the run (one process at a time; in a multi-process run the
    main process holds it), and a resumed run must keep the config that made it.
    """
    config_lib.validate(config)
    d = config.distributed
    parallel.initialize(d.coordinator_address, d.num_processes, d.process_id)
    mesh = parallel.data_mesh()
    parallel.check_batch_size(config.optim.batch_size, mesh)
    workdir = Path(workdir)
    main = parallel.is_main_process()
    with locks.lock(workdir) if main else contextlib.nullcontext():
        return _train(config, workdir, mesh, main)


def _train(config, workdir: Path, mesh, main: bool) -> dict:
    started = time.perf_counter()
    module = model_lib.Transformer(config_lib.model_config(config))
    tx = adam(config.optim.learning_rate)
    k = keys(config.seed)
    last_step = total_steps(config)
    if main:  # a changed experiment is refused before the model is built
        workdir_lib.check(workdir, config)
    state = jax.device_put(
        create_state(module, k["init"], tx, config.task.seq_len), parallel.replicated(mesh)
    )
    saved = checkpoints.list_steps(workdir / CHECKPOINT_DIR)
    if main:  # checked again, then config.json and the history written
        workdir_lib.prepare(workdir, config, saved[-1] if saved else 0)
    mgr = checkpoints.manager(
        workdir / CHECKPOINT_DIR, config.checkpoint_every_steps, config.keep_checkpoints
    )
    start, state = resume(mgr, state, workdir, main)
    writer = MetricsWriter(workdir / METRICS_FILE, main)
    writer.truncate_after(start)
    loop = _Loop(config, mesh, module, tx, k["dropout"], writer, mgr, last_step)
    try:
        state, values = loop.run(state, start, main)
    finally:  # also on Ctrl-C: a save under way finishes rather than dying with the process
        mgr.close()
    if main:
        print(_summary(config, workdir, start, last_step, values, time.perf_counter() - started))
    return state


def resume(mgr, state, workdir: Path, main: bool):
    """(first step, state) from the newest readable checkpoint; damaged newer ones are
    named and set aside."""
    start, restored, skipped = checkpoints.restore_newest_readable(mgr, state)
    for step, reason in skipped:
        print(f"{workdir}: checkpoint {reason}; skipped", file=sys.stderr)
        if main:
            checkpoints.set_aside(mgr, step)
    if skipped:
        print(f"{workdir}: resuming from step {start or 'none (a fresh start)'}", file=sys.stderr)
    return start, (restored if restored is not None else state)


class _Loop:
    """The update loop: steps, then at each boundary the log line, evaluation and
    checkpoint; losses are checked for finiteness only there (no per-step host sync)."""

    def __init__(self, config, mesh, module, tx, dropout_key, writer, mgr, last_step):
        self.config, self.mesh, self.writer, self.mgr = config, mesh, writer, mgr
        self.last_step = last_step
        self.train_set, self.eval_set = make_datasets(config)
        shape = (config.optim.batch_size, config.task.seq_len)
        self.train_step = make_train_step(module, tx, mesh, dropout_key, shape)
        self.eval_step = make_eval_step(module, mesh)

    def run(self, state, start: int, main: bool):
        config = self.config
        bar = tqdm.tqdm(
            total=self.last_step,
            initial=start,
            desc=f"{config.task.name} H={config.model.num_heads}",
            disable=not (main and config.progress_bar),
            unit="step",
        )
        self.pending, self.last_saved, self.t0 = [], (start or None), time.perf_counter()
        values = {}
        for step in range(start, self.last_step):
            batch = self.train_set.batch(step)
            batch = tasks.Examples(*(parallel.shard_batch(a, self.mesh) for a in batch))
            state, loss = self.train_step(state, batch)
            self.pending.append((step + 1, loss))
            logged = self._boundary(state, step + 1, bar)
            values = logged if logged is not None else values
        bar.n = self.last_step
        bar.close()
        return state, values

    def _boundary(self, state, done: int, bar) -> dict | None:
        """At a log, eval or checkpoint step: write the line (and save); else None."""
        config = self.config
        boundary = [done % n == 0 for n in (config.log_every_steps, config.eval_every_steps)]
        save_now = done % config.checkpoint_every_steps == 0 or done == self.last_step
        if not (any(boundary) or save_now):
            return None
        losses = check_finite(self.pending, self.last_saved)
        values = {
            "train/loss": float(np.mean(losses)),
            "steps_per_s": len(self.pending) / (time.perf_counter() - self.t0),
        }
        self.pending, self.t0 = [], time.perf_counter()
        if boundary[1] or done == self.last_step:
            result = evaluate_split(
                self.eval_step, state["params"], self.eval_set, config.optim.batch_size, self.mesh
            )
            values.update({f"eval/{name}": v for name, v in result.items()})
            bar.set_postfix(
                acc=f"{result['accuracy_predictable']:.3f}", loss=f"{values['train/loss']:.3f}"
            )
        self.writer.write(done, values)
        if save_now:
            self._save(state, done)
        bar.update(len(losses))
        return values

    def _save(self, state, done: int) -> None:
        save_if_finite(self.mgr, state, done, self.last_saved, self.last_step)
        self.last_saved = done


def save_if_finite(mgr, state, done: int, last_saved: int | None, last_step: int) -> None:
    """Save step `done` (always the run's last); a non-finite state stops the run instead,
    naming the last good checkpoint."""
    if not all_finite(state):
        raise FloatingPointError(
            f"parameters or optimiser state are not finite at step {done}; stopped "
            f"before saving them, {_last_good(last_saved)}"
        )
    checkpoints.save(mgr, done, state, force=done == last_step)


def _summary(config, workdir, start, last_step, values, seconds) -> str:
    """One line a person reads at the end of a run."""
    if start >= last_step:
        past = f" (past the {last_step} steps the config asks for)" if start > last_step else ""
        return f"{workdir}: already trained to step {start}{past}; nothing to do"
    loss = values.get("train/loss", float("nan"))
    acc = values.get("eval/accuracy_predictable", float("nan"))
    resumed = f" (resumed from {start})" if start else ""
    return (
        f"trained {config.task.name} H={config.model.num_heads} to step {last_step}{resumed} "
        f"in {seconds:.1f} s: train loss {loss:.4f}, eval accuracy (predictable) {acc:.4f}; "
        f"workdir {workdir}"
    )
