"""The training order: which windows make the batch at each step, as a grain `MapDataset`
read by random access (`order[step]`), so a resumed run reads what an uninterrupted one
reads with nothing to save but the step.

Epoch e is a permutation of all windows (e = 0, 1, ...; each a new one), and the epochs
follow one another without a gap; step s takes sample positions [s * B, (s + 1) * B) of
that endless sequence, so a batch may straddle two epochs. The permutation of epoch e is
the argsort of a SplitMix64 hash of (seed, e, window): vectorised (grain's own
`shuffle` hashes one index per Python call, hundreds of microseconds each for a few
thousand windows), and the same on every platform and NumPy version.
"""

from __future__ import annotations

import sys

import grain
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64 (wrapping arithmetic): a bijective mix."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permutation(count: int, seed: int, epoch: int) -> np.ndarray:
    """The window order of one epoch, a pure function of (count, seed, epoch)."""
    with np.errstate(over="ignore"):
        base = splitmix64(np.uint64(seed) * _GOLDEN + np.uint64(epoch))
        keys = splitmix64(np.arange(count, dtype=np.uint64) + base * _GOLDEN)
    return np.argsort(keys, kind="stable")


class BatchOrder(grain.MapDataset):
    """`order[step]`: int64 (batch_size,) window indices of the global batch at `step`.
    Endless; the two latest epochs' permutations are kept."""

    def __init__(self, count: int, batch_size: int, seed: int):
        super().__init__()
        self.count, self.batch_size, self.seed = count, batch_size, seed
        self._epochs: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return sys.maxsize

    def __str__(self) -> str:
        return f"BatchOrder(count={self.count}, batch_size={self.batch_size}, seed={self.seed})"

    def epoch(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            for old in sorted(self._epochs)[:-1]:
                del self._epochs[old]
            self._epochs[epoch] = permutation(self.count, self.seed, epoch)
        return self._epochs[epoch]

    def positions(self, first: int, count: int) -> np.ndarray:
        """The windows at sample positions [first, first + count)."""
        position = np.arange(first, first + count, dtype=np.int64)
        epoch, within = np.divmod(position, self.count)
        found = np.empty(count, np.int64)
        for e in np.unique(epoch):
            pick = epoch == e
            found[pick] = self.epoch(int(e))[within[pick]]
        return found

    def __getitem__(self, step):
        if isinstance(step, slice):
            return self.slice(step)
        return self.positions(int(step) * self.batch_size, self.batch_size)
