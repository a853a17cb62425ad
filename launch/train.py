"""Train one model:

  python launch/train.py --config=configs/cpu.py:task=cycle,heads=8 --workdir=runs/x
  python launch/train.py --config=configs/lm.py:heads=4 --workdir=runs/lm_4   # text

Overrides: --config.optim.learning_rate=3e-4 (a misspelt field is an error).
"""

from absl import flags, logging
from ml_collections import config_flags

from beyondpar.base import cli, parallel
from beyondpar.study import runs

CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:arg].", lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if present).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax reports every save at INFO
    config = cli.config(CONFIG)
    parallel.use_all_cpu_cores(config.optim.batch_size)
    try:
        runs.train_and_evaluate(config, WORKDIR.value)
    except FloatingPointError as err:  # a diverged run: named, with its last good step
        cli.fail(str(err))


if __name__ == "__main__":
    cli.run(main)
