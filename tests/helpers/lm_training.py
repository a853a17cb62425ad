"""A language-model config small enough for tests: 2 layers of d 32 on 32 bytes, 150 steps
of batch 16 on the default corpus (tests/lm/test_lm_train.py, and the process it kills),
and a 4-step one-layer variant for two processes (tests/lm/test_lm_train_processes.py)."""

from configs import lm

TINY = dict(embed_dim=32, num_layers=2, mlp_dim=64, max_len=32)


def tiny_config(steps=150, **optim):
    config = lm.get_config("heads=2")
    config.model.update(TINY)
    config.seq_len = 32
    config.optim.update(
        dict(batch_size=16, learning_rate=1e-2, warmup_steps=10, steps=steps), **optim
    )
    config.log_every_steps = 25
    config.eval_every_steps = 75
    config.checkpoint_every_steps = 50
    config.progress_bar = False
    config.evaluation.update(heldout_windows=16, graph_windows=4, graph_tokens=16, horizon=20)
    config.evaluation.max_steps = 20
    return config


def two_process_config(corpus):
    """The tiny model with one layer and one head (no optimal-weight search; the two
    processes compile every program side by side, neither reading the other's cache) on
    the corpus at `corpus`, 4 steps of batch 8, evaluated once (at the end), checkpoints
    at steps 2 and 4: a two-process run (tests/lm/test_lm_train_processes.py) kept short."""
    config = tiny_config(steps=4, warmup_steps=2)
    config.model.update(num_heads=1, num_layers=1)
    config.data.path = str(corpus)
    config.optim.batch_size = 8
    config.log_every_steps = 2
    config.eval_every_steps = 4
    config.checkpoint_every_steps = 2
    # A fifth of a small corpus held out; 5 windows: padded to 6 to split over 2 devices.
    config.data.heldout_fraction = 0.2
    config.evaluation.update(heldout_windows=5, graph_windows=2, graph_tokens=16)
    return config
