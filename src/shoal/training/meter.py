"""Accumulates a logging interval's training statistics and reduces them over ranks.

Most figures are means over ranks. Where a step's time goes (data, forward and
backward, communication wait, optimizer) and each rank's peak memory are kept
per rank, as `rank<r>_<name>` fields (the names the pipeline's stage figures
use), so the report can draw one bar per rank and show the straggler: each rank
fills its own slots of a vector that the interval's one all-reduce sums.

:class:`RankPhases` is that per-rank recorder, the one every strategy uses: the
step loop's :class:`IntervalMeter` folds it into its all-reduce; federated rounds
and population generations (whose unit is not a step) add their clients' or
members' steps to one and time their own communication and evaluation into it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.runtime.memory import peak_memory_bytes

#: a step's phases, per rank (StepStats field -> metric name)
PHASES = {
    "data_s": "data_s",
    "forward_backward_s": "forward_backward_s",
    "comm_s": "comm_s",
    "optimizer_s": "optimizer_s",
}


@dataclass
class StepStats:
    """What one optimizer step did on this rank."""

    loss_sum: torch.Tensor
    samples: int
    sums: dict[str, torch.Tensor]
    compute_s: float
    comm_s: float
    wall_s: float
    sent_bytes: int = 0
    skipped: bool = False
    data_s: float = 0.0  # reading the batch (the task's train_batch)
    optimizer_s: float = 0.0  # non-finite check, clipping, optimizer and schedule
    grad_norm: float | None = None  # the global gradient norm before clipping, when measured
    forward_backward_s: float = 0.0  # forward and backward (with the overlapped all-reduce)
    #: forward and backward of this rank's share alone (no waiting for peers' gradients)
    work_s: float = 0.0


@dataclass
class RankPhases:
    """This rank's seconds per phase over a unit of work, and every rank's after a reduce.

    `names` are the metric names (`rank<r>_<name>`): the step loop's `PHASES`, and for
    a round or a generation also `eval_s` (members' evaluation) and `other_s` (the
    rest of the unit's wall time). `slots` is this rank's row of a world x (names +
    peak memory) vector, zeros elsewhere: summed over ranks it holds every rank's row.
    """

    names: tuple[str, ...] = tuple(PHASES.values())
    seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seconds = dict.fromkeys(self.names, 0.0)

    def add_step(self, stats: StepStats) -> None:
        """A step's phases (a StepStats field per name in `PHASES`)."""
        for attribute, name in PHASES.items():
            self.seconds[name] += getattr(stats, attribute)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def width(self) -> int:
        return len(self.names) + 1  # and the peak memory

    def slots(self, ctx: WorkerContext, per: float = 1.0) -> list[float]:
        """This rank's seconds per unit (`per` units were recorded) and peak memory (MiB)
        in its own row of a world-wide vector."""
        mine = [self.seconds[name] / max(per, 1.0) for name in self.names]
        mine.append(peak_memory_bytes(ctx.device) / 2**20)
        row = [0.0] * (ctx.world_size * self.width)
        row[ctx.rank * self.width : (ctx.rank + 1) * self.width] = mine
        return row

    def read(self, summed: list[float], world: int) -> dict[str, float]:
        """`rank<r>_<name>` and `rank<r>_peak_mb` from the slots summed over the ranks."""
        metrics = {}
        for rank in range(world):
            row = summed[rank * self.width : (rank + 1) * self.width]
            for metric, value in zip([*self.names, "peak_mb"], row, strict=True):
                metrics[f"rank{rank}_{metric}"] = value
        return metrics

    def reduce(self, ctx: WorkerContext, per: float = 1.0) -> dict[str, float]:
        """Collective: every rank's figures (a strategy with its own counted group folds
        `slots` into a collective of its own and calls `read`)."""
        return self.read(all_reduce_sum(ctx, self.slots(ctx, per)), ctx.world_size)


@dataclass
class IntervalMeter:
    """Sums of one logging interval on this rank; `reduce` turns them into metrics."""

    #: the loss and the task's sums stay where the steps computed them (float64, summed
    #: as the host would sum them) until `reduce`: reading them every step made the host
    #: wait for the GPU's queue to drain every step
    loss_sum: torch.Tensor | float = 0.0
    samples: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    wall_s: float = 0.0
    sent_bytes: float = 0.0
    skipped: int = 0
    steps: int = 0
    sums: dict[str, torch.Tensor | float] = field(default_factory=dict)
    phases: RankPhases = field(default_factory=RankPhases)
    grad_norm: float | None = None  # the latest measured norm of the interval
    started: float = field(default_factory=time.perf_counter)

    def add(self, stats: StepStats) -> None:
        self.loss_sum = self.loss_sum + _as_double(stats.loss_sum)
        self.samples += stats.samples
        self.compute_s += stats.compute_s
        self.comm_s += stats.comm_s
        self.wall_s += stats.wall_s
        self.sent_bytes += stats.sent_bytes
        self.skipped += int(stats.skipped)
        self.steps += 1
        self.phases.add_step(stats)
        if stats.grad_norm is not None:
            self.grad_norm = stats.grad_norm
        for name, value in stats.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + _as_double(value)

    def reduce(self, ctx: WorkerContext) -> dict[str, float]:
        """Collective: sums over ranks. Loss and `train_*` are per sample; times are rank means."""
        names = sorted(self.sums)
        kept = _read([self.loss_sum, *(self.sums[n] for n in names)])
        local = [kept[0], self.samples, self.compute_s, self.comm_s, self.wall_s]
        local += [self.sent_bytes, self.skipped]
        local += [self.grad_norm or 0.0, float(self.grad_norm is not None)]
        local += kept[1:]
        # each rank's own slots: its phases per step and its peak memory
        total = all_reduce_sum(ctx, local + self.phases.slots(ctx, self.steps))
        per_rank, total = total[len(local) :], total[: len(local)]
        samples = max(total[1], 1.0)
        step_time = max(total[4] / ctx.world_size, 1e-9)
        metrics = {
            "loss": total[0] / samples,
            "samples": total[1],
            # throughput over the time spent in steps (not evaluation or checkpoints)
            "samples_per_s": total[1] / step_time,
            "compute_s": total[2] / ctx.world_size,
            "comm_s": total[3] / ctx.world_size,
            "step_s": step_time,
            "interval_s": time.perf_counter() - self.started,
            # bytes each rank put on the wire per step (the mean over ranks)
            "sent_bytes_per_step": total[5] / ctx.world_size / max(self.steps, 1),
            "skipped_steps": total[6] / ctx.world_size,
        }
        if total[8]:  # the ranks that measured it (all, or none, under one gradient sync)
            metrics["grad_norm"] = total[7] / total[8]
        for name, value in zip(names, total[9:], strict=True):
            metrics[f"train_{name}"] = value / samples
        metrics.update(self.phases.read(per_rank, ctx.world_size))
        return metrics


def _as_double(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach().double() if isinstance(value, torch.Tensor) else float(value)


def _read(values: list[torch.Tensor | float]) -> list[float]:
    """The host's floats of `values`, the tensors among them read in one transfer."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    read = iter(torch.stack([t.to(tensors[0].device) for t in tensors]).tolist())
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]
