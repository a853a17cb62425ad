"""The paper's exact setup: 5,000 samples, batch 50, 200 epochs, Adam 1e-3, T = 100.

python launch/train.py --config=configs/paper.py:task=cycle,heads=8 --workdir=runs/cycle_8
"""

from beyondpar.study import config_lib


def get_config(arg=None):
    return config_lib.run_config(arg)
