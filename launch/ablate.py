"""Train, evaluate and report a grid of runs:

python launch/ablate.py --config=configs/ablation.py --workdir=runs/ablation [--dry_run]
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from beyondpar.base import locks, parallel
from beyondpar.study import ablation, config_lib

CONFIG = config_flags.DEFINE_config_file("config", None, "Ablation config file[:arg].")
WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the runs, records and report.")
DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print one train command per run and stop.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    base = config_lib.load_config_file(CONFIG.value.base, CONFIG.value.base_arg or None)
    parallel.use_all_cpu_cores(base.optim.batch_size)
    try:
        if DRY_RUN.value:
            print("\n".join(ablation.dry_run(CONFIG.value, WORKDIR.value)))
            return
        written, failures = ablation.run(CONFIG.value, WORKDIR.value)
    except (ValueError, FileNotFoundError, locks.FolderBusy) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for path in written:
        print(f"wrote {path}")
    for name, message in failures:
        print(f"FAILED {name}: {message}")
    if failures:
        print(f"{len(failures)} run(s) or checkpoint(s) failed; the report lists them")
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
