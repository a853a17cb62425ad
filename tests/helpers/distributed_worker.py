"""One process of a two-process training run (started by tests/study/test_train.py for a
task, tests/lm/test_lm_train_processes.py for a language model).

  distributed_worker.py PORT PROCESS_ID WORKDIR                    # the smoke task
  distributed_worker.py PORT PROCESS_ID WORKDIR text CORPUS RECORD  # a tiny language model

A text run also writes RECORD: the training windows this process loaded at each step.
"""

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 1)

from beyondpar.lm import data as data_lib  # noqa: E402
from beyondpar.study import runs  # noqa: E402
from configs import smoke  # noqa: E402
from helpers.lm_training import two_process_config  # noqa: E402


def task_config():
    config = smoke.get_config()
    config.optim.num_epochs = 1
    return config


def record_windows(loaded: list) -> None:
    """Wrap `TextData.train_windows` so that every call is kept in `loaded`."""
    real = data_lib.TextData.train_windows

    def recording(self, step, batch_size, seq_len, process_index=0, process_count=1):
        picked = real(self, step, batch_size, seq_len, process_index, process_count)
        loaded.append(
            dict(step=step, process_index=process_index, process_count=process_count)
            | dict(windows=[int(w) for w in picked])
        )
        return picked

    data_lib.TextData.train_windows = recording


def main(port: str, process_id: str, workdir: str, kind: str = "task", *text_args) -> None:
    config = two_process_config(text_args[0]) if kind == "text" else task_config()
    config.distributed.update(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id)
    )
    loaded = []
    record_windows(loaded)
    runs.train_and_evaluate(config, workdir)
    assert jax.process_count() == 2 and jax.device_count() == 2
    if kind == "text":
        with open(text_args[1], "w") as f:
            json.dump(loaded, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
