"""Two-process training runs on one machine: `start` launches this file twice (processes
0 and 1 of a `jax.distributed` run on localhost, one CPU device each) and `finish` waits
for both. Each process runs `main`:

  distributed_worker.py PORT PROCESS_ID WORKDIR                    # the smoke task
  distributed_worker.py PORT PROCESS_ID WORKDIR text CORPUS RECORDS  # a tiny language model

A text run also writes RECORDS/record-PROCESS_ID.json: the training windows this process
loaded at each step, and the steps of the metrics lines and TensorBoard scalars it wrote.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import tensorboardX

from beyondpar.base import files
from beyondpar.lm import data as data_lib
from beyondpar.study import runs
from beyondpar.study.workdir import METRICS_FILE
from configs import smoke
from helpers.lm_training import two_process_config

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir, *args) -> list[subprocess.Popen]:
    """Processes 0 and 1 of a run in `workdir` (`args`: as `main`'s after the workdir)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}  # as here
    command = [sys.executable, __file__, str(port)]
    return [
        subprocess.Popen(
            [*command, str(i), str(workdir), *map(str, args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (0, 1)
    ]


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[str]:
    """Each process's output, once both have ended; both must have succeeded."""
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:  # none left running past a timeout
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return outs


def task_config():
    config = smoke.get_config()
    config.optim.num_epochs = 1
    return config


def record(seen: dict) -> None:
    """Keep in `seen` the training windows this process loads at each step (a wrapped
    `TextData.train_windows`) and the steps of the metrics lines and TensorBoard scalars
    it writes (wrapped writes to the files themselves)."""
    seen.update(windows=[], metrics=[], events=[])
    load, line, scalar = (
        data_lib.TextData.train_windows,
        files.append_json_line,
        tensorboardX.SummaryWriter.add_scalar,
    )

    def loading(self, step, batch_size, seq_len, process_index=0, process_count=1):
        picked = load(self, step, batch_size, seq_len, process_index, process_count)
        seen["windows"].append(
            dict(step=step, process_index=process_index, process_count=process_count)
            | dict(windows=[int(w) for w in picked])
        )
        return picked

    def writing_line(path, values):
        if Path(path).name == METRICS_FILE:
            seen["metrics"].append(values["step"])
        return line(path, values)

    def writing_scalar(self, tag, value, global_step=None, *args, **kwargs):
        seen["events"].append(global_step)
        return scalar(self, tag, value, global_step, *args, **kwargs)

    data_lib.TextData.train_windows = loading
    files.append_json_line = writing_line
    tensorboardX.SummaryWriter.add_scalar = writing_scalar


def main(port: str, process_id: str, workdir: str, kind: str = "task", *text_args) -> None:
    jax.config.update("jax_num_cpu_devices", 1)
    config = two_process_config(text_args[0]) if kind == "text" else task_config()
    config.distributed.update(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id)
    )
    seen = {}
    if kind == "text":
        record(seen)
    runs.train_and_evaluate(config, workdir)
    assert jax.process_count() == 2 and jax.device_count() == 2
    if kind == "text":
        Path(text_args[1], f"record-{process_id}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])
