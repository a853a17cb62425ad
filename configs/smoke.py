"""Seconds: a 2-layer model on 16 tokens, for tests.

python launch/train.py --config=configs/smoke.py --workdir=/tmp/smoke
"""

from beyondpar.study import config_lib


def get_config(arg=None):
    config = config_lib.run_config(f"heads=2,{arg}" if arg else "heads=2")
    config.model.update(embed_dim=16, num_layers=2, mlp_dim=32, max_len=16, vocab_size=16)
    config.task.update(seq_len=16, num_train=256, num_eval=64)
    config.optim.update(batch_size=32, num_epochs=8, learning_rate=3e-3)
    config.eval_every_steps = 16
    config.log_every_steps = 8
    config.checkpoint_every_steps = 8
    config.keep_checkpoints = 2
    config.progress_bar = False
    config.evaluation.update(num_sequences=8, horizon=20, max_steps=20)
    return config
