"""The paper's exact setup: 5,000 samples, batch 50, 200 epochs, Adam 1e-3, T = 100.

python launch/train.py --config=configs/paper.py:task=cycle,heads=8 --workdir=runs/cycle_8
"""

from beyondpar import config_lib


def get_config(arg=None):
    args = config_lib.parse_arg(arg, task="copy", heads=4, seed=0)
    config = config_lib.base_config()
    config.task.name = args.task
    config.model.num_heads = args.heads
    config.seed = args.seed
    return config
