"""Re-balancing the partition at checkpoints, from the per-block times measured in training.

A block's time in training is its cost times the speed of the rank that runs it:
`t_b = c_b x s_r`. The costs `c_b` are the profile's (`profile.py`: every rank
times every block before training, the ranks' mean); the speeds are measured
while training: between two checkpoints each rank's compute seconds per step
(its stages' forward and backward chunks and the loss, as the schedule runs them,
`measure.py`), divided by the profiled cost of the blocks it holds, is its speed
(1.0: as fast as the profile; 2.0: twice as slow, e.g. `[faults.inject] kind =
"slow"`). The ranks sum their figures in a vector where each fills its own slots,
so every rank holds the same bits and decides the same; the speeds are smoothed
with data_parallel's rule (`training/balance.py`).

A rank's measured time is one number for all the blocks it holds: the per-block
times (`t_b`, logged) are that time spread over its blocks by their profiled
costs. Blocks are not timed one by one in training (hooks per block would cost
every step); the profile says how the blocks compare, the training clock how
the ranks do.

At a checkpoint the best partition for those times is the exact linear
partition (`partition.py`) with each stage weighted by its rank's speed. The
pipeline moves to it when it would cut the slowest stage's time by more than
`rebalance_threshold` (a fraction of it); otherwise it stays (a move costs a
gather of the whole model and optimizer state, and noise must not make it
oscillate: the speeds are the ranks', so a partition stays best after the move).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.strategies.pipeline.partition import Partition, balanced_partition, stage_costs
from shoal.training.balance import smoothed


def stage_ranks(stages: int, ranks: int) -> list[int]:
    """The rank of each stage (loop placement: stage s on rank s mod ranks)."""
    return [s % ranks for s in range(stages)]


def rank_costs(costs: Sequence[float], partition: Partition, ranks: int) -> list[float]:
    """The profiled cost each rank holds under `partition`."""
    held = [0.0] * ranks
    for stage, cost in enumerate(stage_costs(costs, partition)):
        held[stage % ranks] += cost
    return held


def stage_times(
    costs: Sequence[float], partition: Partition, speeds: Sequence[float]
) -> list[float]:
    """Each stage's predicted seconds: its blocks' costs times its rank's speed."""
    ranks = len(speeds)
    return [speeds[s % ranks] * c for s, c in enumerate(stage_costs(costs, partition))]


@dataclass
class Decision:
    """The partition now, the best one for the measured speeds, each stage's seconds."""

    old: Partition
    new: Partition
    old_times: list[float]
    new_times: list[float]
    threshold: float

    @property
    def gain(self) -> float:
        """The fraction of the slowest stage's time the new partition saves."""
        slowest = max(self.old_times)
        return 1.0 - max(self.new_times) / slowest if slowest > 0 else 0.0

    @property
    def moves(self) -> bool:
        return self.new != self.old and self.gain > self.threshold


def decide(
    costs: Sequence[float], partition: Partition, speeds: Sequence[float], threshold: float
) -> Decision:
    """The best partition of `costs` over ranks of `speeds`, against `partition`."""
    weights = [speeds[s % len(speeds)] for s in range(len(partition))]
    best = balanced_partition(costs, len(partition), weights)
    return Decision(
        list(partition),
        best,
        stage_times(costs, partition, speeds),
        stage_times(costs, best, speeds),
        threshold,
    )


def shares(times: Sequence[float]) -> list[float]:
    total = sum(times) or 1.0
    return [t / total for t in times]


class Rebalancer:
    """The ranks' smoothed speeds, measured between checkpoints, and the decision."""

    def __init__(self, ctx: WorkerContext, costs: Sequence[float], ranks: int, threshold: float):
        self.ctx, self.costs, self.ranks, self.threshold = ctx, list(costs), ranks, threshold
        self.speeds: list[float] | None = None  # per rank: measured / profiled seconds
        self.moves = 0

    def measure(self, partition: Partition, compute_s: float, steps: int) -> None:
        """Collective: every rank's compute seconds and steps since the last call, in one
        sum where each rank fills its own slots; the speeds smoothed."""
        ranks, rank = self.ranks, self.ctx.rank
        mine = [0.0] * (2 * ranks)
        if rank < ranks:
            mine[rank], mine[ranks + rank] = compute_s, float(steps)
        total = all_reduce_sum(self.ctx, mine)
        held = rank_costs(self.costs, partition, ranks)
        measured = [
            total[r] / total[ranks + r] / held[r]
            if total[ranks + r] > 0 and held[r] > 0
            # no step measured: nan keeps the old estimate
            else math.nan
            for r in range(ranks)
        ]
        self.speeds = smoothed(self.speeds, measured)

    def decide(self, partition: Partition) -> Decision | None:
        """The decision for the smoothed speeds; None until every rank has one."""
        speeds = self.speeds
        if speeds is None or not all(math.isfinite(s) and s > 0 for s in speeds):
            return None
        return decide(self.costs, partition, speeds, self.threshold)

    def block_seconds(self, partition: Partition) -> list[float]:
        """Each block's seconds per step on the rank that holds it (see the docstring)."""
        speeds = self.speeds or [1.0] * self.ranks
        seconds: list[float] = []
        for stage, (first, last) in enumerate(partition):
            speed = speeds[stage % self.ranks]
            seconds.extend(speed * self.costs[b] for b in range(first, last + 1))
        return seconds

    def state_dict(self) -> dict[str, Any]:
        return {"speeds": self.speeds, "moves": self.moves}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        speeds = state.get("speeds")
        if speeds is not None and len(speeds) == self.ranks:
            self.speeds = [float(s) for s in speeds]
        self.moves = int(state.get("moves", 0))
