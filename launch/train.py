"""Train one model:

  python launch/train.py --config=configs/cpu.py:task=cycle,heads=8 --workdir=runs/x

Overrides: --config.optim.learning_rate=3e-4 (a misspelt field is an error).
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from beyondpar.base import locks, parallel
from beyondpar.study import train

CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:arg].", lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if present).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax reports every save at INFO
    parallel.use_all_cpu_cores(CONFIG.value.optim.batch_size)
    try:
        train.train_and_evaluate(CONFIG.value, WORKDIR.value)
    except (ValueError, FloatingPointError, locks.FolderBusy) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
