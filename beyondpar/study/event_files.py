"""TensorBoard event files of a run, in its workdir beside `metrics.jsonl`: every logged
number as a scalar under the same name, written by process 0 only
(`tensorboard --logdir WORKDIR`, or the folder of an ablation's runs)."""

from __future__ import annotations

import math
import os

from tensorboardX import SummaryWriter


class EventWriter:
    """Scalars per step. `first_step`: the step a resumed run starts from; events a
    killed run wrote after it are purged from the view, as its metrics lines are."""

    def __init__(self, logdir: str | os.PathLike, active: bool, first_step: int = 0):
        self.writer = None
        if active:
            purge = first_step + 1 if first_step else None
            self.writer = SummaryWriter(str(logdir), purge_step=purge, flush_secs=30)

    def write(self, step: int, values: dict) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
