"""Language models at heads 1, 2, 4, 8 and 16 x 3 seeds, parameter-matched (d_model
fixed, head dimension d_model / heads), on the default corpus or `overrides.data__path`.

  python launch/ablate.py --config=configs/lm_ablation.py --workdir=runs/lm_ablation   # CPU
  python launch/ablate.py --config=configs/lm_ablation.py:size=gpu --workdir=runs/lm_gpu
  python launch/ablate.py --config=configs/lm_ablation.py:size=tpu --workdir=runs/lm \
      --config.overrides.data__path=corpus.jsonl --dry_run    # one train command per run

Arguments: `size` (a named size of configs/lm.py), `seeds` (3). `axes` maps a label to
the config field it sets, `levels` lists its values, `overrides` sets fields of every run
(dotted names written with `__`). Each run logs its held-out bits per byte and its
attention graphs' measures while it trains; the report (`report/report.md`) gives the
last evaluation of every run by head count.
"""

from pathlib import Path

import ml_collections
from ml_collections import config_dict

from beyondpar.base import settings
from beyondpar.study import config_lib

HEADS = (1, 2, 4, 8, 16)


def get_config(arg=None):
    args = config_lib.parse_arg(arg, size="cpu", seeds=3)
    c = ml_collections.ConfigDict()
    c.base = str(Path(__file__).with_name("lm.py"))
    c.base_arg = f"size={args.size}"
    c.axes = ml_collections.ConfigDict({"heads": "model.num_heads", "seed": "seed"})
    c.levels = ml_collections.ConfigDict({"heads": HEADS, "seed": tuple(range(args.seeds))})
    c.overrides = ml_collections.ConfigDict(
        {
            name.replace(".", "__"): config_dict.placeholder(type(value))
            for name, value in settings.flatten(
                config_lib.load_config_file(c.base, c.base_arg).to_dict()
            ).items()
        }
    )
    c.steps = "latest"
    return c
