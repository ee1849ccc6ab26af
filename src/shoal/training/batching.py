"""Which samples form each step's global batch, and which of them each rank gets.

The global batch of step i of epoch e is fixed by (seed, e, i) alone, never by the
world size: rank r takes a contiguous slice of it, slices differing in size by at
most one. So every sample is seen exactly once per epoch, and 1 rank x B and
N ranks x B/N work on the same samples, also when N does not divide B.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from shoal.protocols.task import rank_slice
from shoal.training.permutation import KeyedPermutation

#: up to this many samples an epoch's order is NumPy's permutation, held as int32 (64 MiB
#: at most): the order of every run before the keyed one, bit for bit
MATERIALISED_SAMPLES = 1 << 24

#: above it, the keyed order is computed about this many positions at a time (whole
#: batches; 128 KiB as int64): NumPy's cost per call dominates a batch of 2,048 (0.33 ms a
#: batch of a 49M-sample order; 0.12 ms in blocks of 16k)
KEYED_BLOCK_SAMPLES = 1 << 14


class EpochPlan:
    """The order of samples in one epoch, cut into global batches.

    No rank holds more than a block of the order beyond `MATERIALISED_SAMPLES`: up to it,
    the order is NumPy's permutation of the samples for (seed, epoch), stored as int32
    (shuffling an int32 array draws the same swaps as NumPy's int64 `permutation`, so
    the order is the one runs have always had, at half the memory); above it, each
    block of global batches (`KEYED_BLOCK_SAMPLES`) is computed on its own from a keyed
    permutation (`permutation.KeyedPermutation`), which a NumPy permutation cannot do: its last
    position depends on every draw. Either way the order is a function of (seed, epoch,
    number of samples): every rank, and a resumed run, draws the same batches."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        epoch: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_steps = steps_per_epoch(num_samples, batch_size, drop_last)
        self._order: np.ndarray | None = None
        self._keyed: KeyedPermutation | None = None
        self._batches_per_block = max(1, KEYED_BLOCK_SAMPLES // max(batch_size, 1))
        self._block: tuple[int, np.ndarray] | None = None  # (block number, its positions)
        if shuffle and num_samples <= MATERIALISED_SAMPLES:
            self._order = np.arange(num_samples, dtype=np.int32)
            np.random.default_rng([seed, epoch]).shuffle(self._order)
        elif shuffle:
            self._keyed = KeyedPermutation(num_samples, seed, epoch)

    def global_batch(self, step: int) -> torch.Tensor:
        start = step * self.batch_size
        stop = min(start + self.batch_size, self.num_samples)
        if self._order is not None:
            batch = self._order[start:stop].astype(np.int64)
        elif self._keyed is not None:
            batch = self._keyed_batch(step, start, stop)
        else:
            batch = np.arange(start, max(start, stop), dtype=np.int64)
        return torch.from_numpy(batch)

    def _keyed_batch(self, step: int, start: int, stop: int) -> np.ndarray:
        """Positions [start, stop) of the keyed order, from the block of batches holding them
        (a copy: a caller may change its batch, never the block)."""
        assert self._keyed is not None
        number = step // self._batches_per_block
        first = number * self._batches_per_block * self.batch_size
        if self._block is None or self._block[0] != number:
            last = first + self._batches_per_block * self.batch_size
            self._block = (number, self._keyed.at(first, last))
        return self._block[1][start - first : stop - first].copy()


def steps_per_epoch(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else math.ceil(num_samples / batch_size)


def local_share(
    global_batch: torch.Tensor, rank: int, world_size: int, unit: int = 1
) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (possibly empty), made of whole `unit`s
    of it (runs of `unit` samples counted from the batch's start; the last may be short).
    Samples that share something by their place in the batch (a chunk of KGE positives
    shares its negatives, keyed by the chunk's first sample: `Task.batch_unit`) then share
    it on any number of ranks, as in one process: the batch splits into the same units
    whatever the world size."""
    units = rank_slice(-(-len(global_batch) // unit), rank, world_size)
    return global_batch[units.start * unit : units.stop * unit]


def micro_batches(indices: torch.Tensor, count: int, unit: int = 1) -> list[torch.Tensor]:
    """Split into `count` near-equal micro-batches of whole `unit`s (`local_share`), some
    empty when there are few indices."""
    return [local_share(indices, index, count, unit) for index in range(count)]
