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


class EpochPlan:
    """The order of samples in one epoch, cut into global batches."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        epoch: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if shuffle:
            order = np.random.default_rng([seed, epoch]).permutation(num_samples)
            self.order = torch.from_numpy(order)
        else:
            self.order = torch.arange(num_samples)
        self.batch_size = batch_size
        self.num_steps = steps_per_epoch(num_samples, batch_size, drop_last)

    def global_batch(self, step: int) -> torch.Tensor:
        return self.order[step * self.batch_size : (step + 1) * self.batch_size]


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
