"""Language-model training on real text: `train_and_evaluate(config, workdir)` for a
config of `configs/lm.py`.

The pieces are the task loop's (`train`): the data mesh, the workdir's one-experiment
rule and lock, orbax checkpoints resumed from the newest readable one, `metrics.jsonl`.
The batch of update s is `TextData.train_batch(s, ...)`, a function of (seed, s), so a
run killed at any point and resumed ends with the parameters of an uninterrupted one.
At each evaluation: held-out loss in nats per token and bits per byte, and the attention
graphs' measures (`text_graphs`); every logged number also goes to TensorBoard.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np
import tqdm

from beyondpar import checkpoints
from beyondpar import model as model_lib
from beyondpar.base import locks, parallel
from beyondpar.lm import data as data_lib
from beyondpar.study import (
    config_lib,
    event_files,
    text_config,
    text_graphs,
    text_optim,
    text_step,
    train,
)
from beyondpar.study import workdir as workdir_lib
from beyondpar.study.workdir import CHECKPOINT_DIR, METRICS_FILE


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Train (or resume) the language model of `config` in `workdir`; returns the state."""
    text_config.validate(config)
    d = config.distributed
    parallel.initialize(d.coordinator_address, d.num_processes, d.process_id)
    mesh = parallel.data_mesh()
    text_config.check_devices(config, mesh.size)
    workdir = Path(workdir)
    main = parallel.is_main_process()
    with locks.lock(workdir) if main else contextlib.nullcontext():
        return _train(config, workdir, mesh, main)


def _train(config, workdir: Path, mesh, main: bool) -> dict:
    started = time.perf_counter()
    if main:  # a changed experiment is refused before the corpus or the model is touched
        workdir_lib.check(workdir, config)
    text_data = data_lib.load(config.data, config.seed, cache_dir=str(workdir))
    data_lib.check_vocab(text_data, config.model.vocab_size)
    module = model_lib.Transformer(config_lib.model_config(config))
    settings = text_optim.OptimSettings.from_config(config.optim)
    tx = text_optim.optimizer(settings)
    k = train.keys(config.seed)
    state = train.create_state(module, k["init"], tx, config.seq_len)
    state = jax.device_put(state, parallel.replicated(mesh))
    saved = checkpoints.list_steps(workdir / CHECKPOINT_DIR)
    if main:  # checked again, then config.json and the history written
        workdir_lib.prepare(workdir, config, saved[-1] if saved else 0)
    mgr = checkpoints.manager(
        workdir / CHECKPOINT_DIR, config.checkpoint_every_steps, config.keep_checkpoints
    )
    start, state = train.resume(mgr, state, workdir, main)
    writer = train.MetricsWriter(workdir / METRICS_FILE, main)
    writer.truncate_after(start)
    events = event_files.EventWriter(workdir, main, start)
    loop = TextLoop(config, mesh, module, tx, text_data, k["dropout"], (writer, events), mgr)
    try:
        state, values = loop.run(state, start, main)
    finally:  # also on Ctrl-C: a save under way finishes rather than dying with the process
        mgr.close()
        events.close()
    if main:
        seconds = time.perf_counter() - started
        print(
            summary(
                config, workdir, start, values, seconds, model_lib.count_params(state["params"])
            )
        )
    return state


class TextLoop:
    """Updates; at each log, evaluation or checkpoint step the line, the held-out loss
    and graphs, and the save. Losses reach the host only there (no per-step sync)."""

    def __init__(self, config, mesh, module, tx, text_data, dropout_key, sinks, mgr):
        self.config, self.mesh, self.module, self.mgr = config, mesh, module, mgr
        self.data, self.dropout_key = text_data, dropout_key
        self.writer, self.events = sinks
        device = mesh.devices.flat[0]
        dtype = text_step.resolve_dtype(config.compute_dtype, device.platform).name
        windows_shape = (config.optim.batch_size, config.seq_len + 1)
        self.update = text_step.jitted_update(
            module, tx, mesh, config.optim.microbatches, dtype, windows_shape
        )
        self.window_nats = text_step.jitted_window_nats(module, mesh, dtype)
        self.heldout = np.asarray(
            text_data.heldout_windows(config.evaluation.heldout_windows, config.seq_len)
        )
        self.graph_windows = text_graphs.graph_windows(self.heldout, config.evaluation)
        self.schedule = text_optim.schedule(text_optim.OptimSettings.from_config(config.optim))
        cfg = config_lib.model_config(config)
        self.flops_per_token = text_config.flops_per_token(cfg, config.seq_len)
        peak = text_config.peak_flops(device.device_kind)
        self.peak = None if peak is None else peak * mesh.size

    def batch(self, step: int) -> jax.Array:
        """Update `step`'s windows: this process's rows, assembled into the global batch."""
        b, t = self.config.optim.batch_size, self.config.seq_len
        local = self.data.train_batch(step, b, t, jax.process_index(), jax.process_count())
        sharding = parallel.batch_sharded(self.mesh)
        return jax.make_array_from_process_local_data(sharding, np.asarray(local), (b, t + 1))

    def run(self, state, start: int, main: bool):
        last = self.config.optim.steps
        bar = tqdm.tqdm(
            total=last,
            initial=start,
            desc=f"text H={self.config.model.num_heads}",
            disable=not (main and self.config.progress_bar),
            unit="step",
        )
        self.pending, self.last_saved, self.t0 = [], (start or None), time.perf_counter()
        values = {}
        for step in range(start, last):
            state, metrics = self.update(state, self.batch(step), self.dropout_key)
            self.pending.append((step + 1, metrics))
            logged = self.boundary(state, step + 1, bar)
            values = logged if logged is not None else values
        bar.n = last
        bar.close()
        return state, values

    def boundary(self, state, done: int, bar) -> dict | None:
        """At a log, eval or checkpoint step: write the line (and save); else None."""
        c = self.config
        log, evaluate = (done % n == 0 for n in (c.log_every_steps, c.eval_every_steps))
        last = done == c.optim.steps
        save_now = done % c.checkpoint_every_steps == 0 or last
        if not (log or evaluate or save_now):
            return None
        count = len(self.pending)
        values = self.train_values(done)
        if evaluate or last:
            values.update(self.evaluate(state["params"]))
            bar.set_postfix(bpb=f"{values['eval/bits_per_byte']:.3f}")
        self.writer.write(done, values)
        self.events.write(done, values)
        if save_now:
            train.save_if_finite(self.mgr, state, done, self.last_saved, c.optim.steps)
            self.last_saved = done
        bar.update(count)
        self.t0 = time.perf_counter()  # evaluation and saving are not training time
        return values

    def train_values(self, done: int) -> dict:
        """Mean loss and gradient norm since the last line, learning rate, throughput."""
        losses = train.check_finite([(s, m["loss"]) for s, m in self.pending], self.last_saved)
        norms = [float(m["grad_norm"]) for _, m in self.pending]
        seconds = time.perf_counter() - self.t0
        tokens = len(losses) * self.config.optim.batch_size * self.config.seq_len
        values = {
            "train/loss": float(np.mean(losses)),
            "train/grad_norm": float(np.mean(norms)),
            "train/learning_rate": float(self.schedule(done - 1)),
            "steps_per_s": len(losses) / seconds,
            "tokens_per_s": tokens / seconds,
        }
        if self.peak is not None:
            values["mfu"] = values["tokens_per_s"] * self.flops_per_token / self.peak
        self.pending = []
        return values

    def evaluate(self, params) -> dict:
        """Held-out loss (nats per token), bits per byte, and the graphs' measures."""
        nats = heldout_nats(self.window_nats, params, self.heldout, self.mesh)
        loss = float(nats.sum() / (self.heldout.shape[0] * self.config.seq_len))
        values = {
            "eval/loss": loss,
            "eval/bits_per_byte": data_lib.bits_per_byte(loss, self.data),
        }
        measures = text_graphs.graph_measures(
            self.module, params, self.graph_windows, self.config.evaluation
        )
        return {**values, **measures}


def heldout_nats(window_nats, params, windows_NxT1: np.ndarray, mesh) -> np.ndarray:
    """Each held-out window's summed nats (N,), in chunks padded to split over `mesh`."""
    n = windows_NxT1.shape[0]
    chunk = -(-min(n, 64) // mesh.size) * mesh.size
    out = []
    for first in range(0, n, chunk):
        index = np.minimum(np.arange(first, first + chunk), n - 1)
        windows = parallel.shard_batch(windows_NxT1[index], mesh)
        out.append(np.asarray(jax.device_get(window_nats(params, windows))))
    return np.concatenate(out)[:n]


def summary(config, workdir, start: int, values: dict, seconds: float, params: int) -> str:
    """One line a person reads at the end of a run, with how the heads split d_model."""
    last, cfg = config.optim.steps, config_lib.model_config(config)
    if start >= last:
        return f"{workdir}: already trained to step {start}; nothing to do"
    resumed = f" (resumed from {start})" if start else ""
    return (
        f"trained a {config.size} language model, H={cfg.num_heads} heads of dimension "
        f"{cfg.head_dim} (d_model {cfg.embed_dim} / {cfg.num_heads}: {params:,} parameters "
        f"at every head count), to step {last}{resumed} in {seconds:.1f} s: held-out "
        f"{values.get('eval/loss', float('nan')):.4f} nats/token, "
        f"{values.get('eval/bits_per_byte', float('nan')):.4f} bits/byte; workdir {workdir}"
    )
