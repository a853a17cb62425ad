"""One entry for every kind of run: a task's (`train`) or a language model's
(`text_training`), told apart by the config (`text_config.is_text`: it names a corpus).
Launchers and ablations call these, never one kind's module directly."""

from __future__ import annotations

import ml_collections

from beyondpar.study import config_lib, text_config, text_training, train


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Train (or resume) the run of `config` in `workdir`; returns the final state."""
    if text_config.is_text(config):
        return text_training.train_and_evaluate(config, workdir)
    return train.train_and_evaluate(config, workdir)


def total_steps(config: ml_collections.ConfigDict) -> int:
    """Updates in the whole run."""
    if text_config.is_text(config):
        return config.optim.steps
    return train.total_steps(config)


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError for a config that cannot run, before any work starts."""
    if text_config.is_text(config):
        text_config.validate(config)
    else:
        config_lib.validate(config)
