"""The paper's study as an ablation: heads 1/4/8/16 x tasks copy/cycle x seeds.

  python launch/ablate.py --config=configs/ablation.py --workdir=runs/ablation        # CPU
  python launch/ablate.py --config=configs/ablation.py:base=paper,seeds=3 --workdir=runs/paper
  python launch/ablate.py --config=configs/ablation.py:tasks=attention --workdir=runs/attn
  python launch/ablate.py --config=configs/ablation.py --workdir=runs/x --dry_run     # commands

`axes` maps a label to the config field it sets; `levels` lists each label's values.
`overrides` sets further fields of every run (dotted names written with `__`).
`tasks`: `paper` (copy, cycle: the paper's; copy does not need attention), `attention`
(cycle, shift, pair_sum, induction: tasks that need attention) or `demo` (cycle and
induction: a small study of two tasks that need attention).
"""

from pathlib import Path

import ml_collections
from ml_collections import config_dict

from beyondpar import tasks
from beyondpar.base import settings
from beyondpar.study import config_lib

TASK_PRESETS = {
    "paper": ("copy", "cycle"),
    "attention": tasks.ATTENTION_TASKS,
    "demo": ("cycle", "induction"),
}


def get_config(arg=None):
    args = config_lib.parse_arg(arg, base="cpu", seeds=1, tasks="paper")
    if args.tasks not in TASK_PRESETS:
        raise ValueError(f"tasks must be one of {sorted(TASK_PRESETS)}, got {args.tasks!r}")
    c = ml_collections.ConfigDict()
    c.base = str(Path(__file__).with_name(f"{args.base}.py"))
    c.base_arg = ""
    c.axes = ml_collections.ConfigDict(
        {"task": "task.name", "heads": "model.num_heads", "seed": "seed"}
    )
    c.levels = ml_collections.ConfigDict(
        {
            "task": TASK_PRESETS[args.tasks],
            "heads": (1, 4, 8, 16),
            "seed": tuple(range(args.seeds)),
        }
    )
    # Every field of the base config, unset: `--config.overrides.optim__learning_rate=1e-2`
    # sets one for every run (dotted names written with `__`).
    c.overrides = ml_collections.ConfigDict(
        {
            name.replace(".", "__"): config_dict.placeholder(type(value))
            for name, value in settings.flatten(
                config_lib.load_config_file(c.base).to_dict()
            ).items()
        }
    )
    c.steps = "latest"  # or "all": every saved step, for metrics over training
    return c
