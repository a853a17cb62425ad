"""The files of one training run's workdir, named once for every module that reads them."""

CONFIG_FILE = "config.json"  # the run's config, rewritten atomically on allowed changes
HISTORY_FILE = "config_history.jsonl"  # every allowed change, with the step it came at
LOCK_FILE = ".lock"  # one process per workdir
CHECKPOINT_DIR = "checkpoints"  # orbax steps and their checksums
METRICS_FILE = "metrics.jsonl"  # one JSON line per logged step
