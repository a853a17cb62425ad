"""Train, evaluate and report a grid of runs:

python launch/ablate.py --config=configs/ablation.py --workdir=runs/ablation [--dry_run]
"""

from absl import flags, logging
from ml_collections import config_flags

from beyondpar.base import cli, parallel
from beyondpar.study import ablation, config_lib

CONFIG = config_flags.DEFINE_config_file("config", None, "Ablation config file[:arg].")
WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the runs, records and report.")
DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print one train command per run and stop.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    ablation_config = cli.config(CONFIG)
    base = config_lib.load_config_file(ablation_config.base, ablation_config.base_arg or None)
    parallel.use_all_cpu_cores(base.optim.batch_size)
    if DRY_RUN.value:
        print("\n".join(ablation.dry_run(ablation_config, WORKDIR.value)))
        return 0
    written, failures = ablation.run(ablation_config, WORKDIR.value)
    for path in written:
        print(f"wrote {path}")
    for name, message in failures:
        print(f"FAILED {name}: {message}")
    if failures:
        print(f"{len(failures)} run(s) or checkpoint(s) failed; the report lists them")
        return 1
    return 0


if __name__ == "__main__":
    cli.run(main)
