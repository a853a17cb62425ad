"""The paper's study as an ablation: heads 1/4/8/16 x tasks copy/cycle x seeds.

  python launch/ablate.py --config=configs/ablation.py --workdir=runs/ablation        # CPU
  python launch/ablate.py --config=configs/ablation.py:base=paper,seeds=3 --workdir=runs/paper
  python launch/ablate.py --config=configs/ablation.py --workdir=runs/x --dry_run     # commands

`axes` maps a label to the config field it sets; `levels` lists each label's values.
`overrides` sets further fields of every run (dotted names written with `__`).
"""

from pathlib import Path

import ml_collections

from beyondpar import config_lib


def get_config(arg=None):
    args = config_lib.parse_arg(arg, base="cpu", seeds=1)
    c = ml_collections.ConfigDict()
    c.base = str(Path(__file__).with_name(f"{args.base}.py"))
    c.base_arg = ""
    c.axes = ml_collections.ConfigDict(
        {"task": "task.name", "heads": "model.num_heads", "seed": "seed"}
    )
    c.levels = ml_collections.ConfigDict(
        {"task": ("copy", "cycle"), "heads": (1, 4, 8, 16), "seed": tuple(range(args.seeds))}
    )
    c.overrides = ml_collections.ConfigDict()
    c.steps = "latest"  # or "all": every saved step, for metrics over training
    return c
