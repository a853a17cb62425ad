"""Every named size of configs/lm.py on the mesh it names: its model, shardings and one
training step built and lowered over that many fake CPU devices (abstract shapes: no
parameter is allocated), with its parameter count and memory per device printed."""

import json
import os
import subprocess
import sys
from pathlib import Path

from configs import lm

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, jax, jax.numpy as jnp
from beyondpar import model as model_lib
from beyondpar.base import parallel
from beyondpar.study import config_lib, text_config, text_optim, text_step, train
from configs import lm

for size, spec in lm.SIZES.items():
    config = lm.get_config(f"heads=16,size={size}")
    devices = spec["devices"]
    text_config.validate(config)
    text_config.check_devices(config, devices)
    mesh = parallel.data_mesh(jax.devices()[:devices])
    module = model_lib.Transformer(config_lib.model_config(config))
    tx = text_optim.optimizer(text_optim.OptimSettings.from_config(config.optim))
    state = jax.eval_shape(
        lambda: train.create_state(module, jax.random.PRNGKey(0), tx, config.seq_len)
    )
    dtype = "float32" if size == "cpu" else "bfloat16"
    step = text_step.jitted_update(module, tx, mesh, config.optim.microbatches, dtype)
    windows = jax.ShapeDtypeStruct((config.optim.batch_size, config.seq_len + 1), jnp.int32)
    lowered = step.lower(state, windows, jax.random.PRNGKey(1))
    text = lowered.as_text()
    nats = text_step.jitted_window_nats(module, mesh, dtype).lower(state["params"], windows)
    act_bytes = 4 if dtype == "float32" else 2
    print(json.dumps(dict(
        size=size,
        devices=devices,
        params=model_lib.count_params(state["params"]),
        memory_gb=text_config.memory_per_device_bytes(config, devices, act_bytes) / 2**30,
        bfloat16="bf16" in text,
        all_reduce="all-reduce" in text or "all_reduce" in text,
        lowered_eval=bool(nats.as_text()),
    )), flush=True)
"""


def test_lm_train_every_named_size_lowers_on_the_mesh_it_names():
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=16"
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["size"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(rows) == set(lm.SIZES)
    for size, row in rows.items():
        print(
            f"{size}: {row['devices']} devices, {row['params']:,} parameters, "
            f"~{row['memory_gb']:.2f} GB per device"
        )
        assert row["lowered_eval"] and (row["devices"] == 1 or row["all_reduce"])
        assert row["bfloat16"] == (size != "cpu")
        limit = lm.SIZES[size]["memory_gb"]
        assert limit is None or row["memory_gb"] < 0.8 * limit, (size, row["memory_gb"])
    assert rows["gpu"]["params"] == rows["gpu8"]["params"] == rows["tpu"]["params"] == 86_215_936
