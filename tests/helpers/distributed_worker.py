"""One process of a two-process training run (started by test_train.py)."""

import sys

import jax

jax.config.update("jax_num_cpu_devices", 1)

from beyondpar.study import train  # noqa: E402
from configs import smoke  # noqa: E402


def main(port: str, process_id: str, workdir: str) -> None:
    config = smoke.get_config()
    config.optim.num_epochs = 1
    config.distributed.update(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id)
    )
    train.train_and_evaluate(config, workdir)
    assert jax.process_count() == 2 and jax.device_count() == 2


if __name__ == "__main__":
    main(*sys.argv[1:])
