"""Dynamic shares of the global batch: each data-parallel worker's slice follows its speed.

The loss is a sum over the global batch divided by its size, and the gradients are
summed over the workers, so *how* a global batch is split does not change the
update: N workers reproduce one process under any split. That lets a job give a
slow worker less of each batch without changing what it learns.

Every rank measures its own work (forward and backward time of its slice, without
waiting for peers) and samples; every `every` steps the ranks sum those figures in
a vector where each rank fills only its own slots (so the sum is exact and the same
bits on every rank), and every rank computes the same new plan from it:

    speed_r  <- smoothed (exponential average) samples per second of rank r
    share_r  =  speed_r / sum(speed), at least `min_share` x the even share
    counts   =  share x batch size, rounded by largest remainder (ties to the lower rank)

The plan (fractions and speeds) is a checkpoint part, so a resumed run splits its
batches as the run that saved them did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext

#: weight of the newest measurement in the smoothed speed (the rest is the old estimate)
SMOOTHING = 0.5


def smoothed(old: Sequence[float] | None, measured: Sequence[float]) -> list[float]:
    """Speeds averaged exponentially (weight SMOOTHING on the newest); a rank measured no
    time for (nan) keeps its old estimate, one never measured is 0."""
    if old is None:
        return [m if math.isfinite(m) else 0.0 for m in measured]
    return [
        SMOOTHING * m + (1 - SMOOTHING) * prev if math.isfinite(m) else prev
        for m, prev in zip(measured, old, strict=True)
    ]


def bounded_fractions(speeds: Sequence[float], min_share: float) -> list[float]:
    """Fractions proportional to `speeds`, each at least `min_share` / n, summing to 1."""
    n = len(speeds)
    floor = min_share / n
    total = sum(speeds)
    if total <= 0 or not all(math.isfinite(s) for s in speeds):
        return [1.0 / n] * n
    fractions = [s / total for s in speeds]
    pinned: set[int] = set()
    while True:  # pin those below the floor to it, re-scale the rest; at most n rounds
        low = {r for r, f in enumerate(fractions) if f < floor and r not in pinned}
        if not low:
            return fractions
        pinned |= low
        free = [r for r in range(n) if r not in pinned]
        left = 1.0 - floor * len(pinned)
        free_total = sum(fractions[r] for r in free)
        for r in range(n):
            if r in pinned:
                fractions[r] = floor
            elif free_total > 0:
                fractions[r] = fractions[r] / free_total * left


def split_counts(total: int, fractions: Sequence[float]) -> list[int]:
    """`total` samples dealt by `fractions` (largest remainder; ties to the lower rank), every
    rank getting one at least while there are as many samples as ranks."""
    quotas = [f * total for f in fractions]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(counts)), key=lambda r: (counts[r] - quotas[r], r))
    for r in order[: total - sum(counts)]:
        counts[r] += 1
    if total >= len(counts):
        for r in range(len(counts)):
            if counts[r] == 0:
                counts[max(range(len(counts)), key=lambda q: (counts[q], -q))] -= 1
                counts[r] = 1
    return counts


class BatchShares:
    """This rank's slice of every global batch, re-planned from measured speeds."""

    def __init__(self, ctx: WorkerContext, every: int, min_share: float) -> None:
        self.ctx, self.every, self.min_share = ctx, every, min_share
        world = ctx.world_size
        self.fractions = [1.0 / world] * world
        self.speeds: list[float] | None = None  # samples/s per rank, smoothed
        self.plans = 0
        self._samples, self._work_s, self._steps = 0, 0.0, 0

    def local(self, global_batch: torch.Tensor, unit: int = 1) -> torch.Tensor:
        """This rank's contiguous slice of `global_batch` under the current plan, in whole
        `unit`s of samples (`Task.batch_unit`)."""
        counts = split_counts(-(-len(global_batch) // unit), self.fractions)
        start = sum(counts[: self.ctx.rank]) * unit
        return global_batch[start : start + counts[self.ctx.rank] * unit]

    def observe(self, samples: int, work_s: float) -> bool:
        """One step's figures of this rank; every `every` steps a collective re-plan (the
        same on every rank: call it on every rank after every step). True if re-planned."""
        self._samples += samples
        self._work_s += work_s
        self._steps += 1
        if self._steps % self.every:
            return False
        self._replan()
        return True

    def _replan(self) -> None:
        world, rank = self.ctx.world_size, self.ctx.rank
        mine = [0.0] * (2 * world)  # each rank fills its own slots: an exact sum
        mine[rank], mine[world + rank] = float(self._samples), self._work_s
        total = all_reduce_sum(self.ctx, mine)
        self._samples, self._work_s = 0, 0.0
        measured = [
            total[r] / total[world + r] if total[world + r] > 0 else math.nan for r in range(world)
        ]
        self.speeds = smoothed(self.speeds, measured)
        if all(s > 0 for s in self.speeds):
            self.fractions = bounded_fractions(self.speeds, self.min_share)
        self.plans += 1

    def describe(self, batch_size: int) -> str:
        counts = split_counts(batch_size, self.fractions)
        speeds = ", ".join(f"{s:.0f}" for s in self.speeds or [])
        return f"shares of a batch of {batch_size}: {counts} (samples/s per rank: {speeds})"

    def state_dict(self) -> dict[str, Any]:
        return {"fractions": list(self.fractions), "speeds": self.speeds, "plans": self.plans}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A plan for another number of workers is dropped: the shares start even."""
        fractions = state.get("fractions") or []
        if len(fractions) != self.ctx.world_size:
            self.ctx.log.info(
                "the checkpoint's batch shares are for %d workers, this job has %d: "
                "starting from even shares",
                len(fractions),
                self.ctx.world_size,
            )
            return
        self.fractions = [float(f) for f in fractions]
        speeds = state.get("speeds")
        self.speeds = [float(s) for s in speeds] if speeds is not None else None
        self.plans = int(state.get("plans", 0))
