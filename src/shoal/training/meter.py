"""Accumulates a logging interval's training statistics and reduces them over ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext


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
    #: forward and backward of this rank's share alone (no waiting for peers' gradients)
    work_s: float = 0.0


@dataclass
class IntervalMeter:
    """Sums of one logging interval on this rank; `reduce` turns them into metrics."""

    loss_sum: float = 0.0
    samples: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    wall_s: float = 0.0
    sent_bytes: float = 0.0
    skipped: int = 0
    steps: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def add(self, stats: StepStats) -> None:
        self.loss_sum += float(stats.loss_sum)
        self.samples += stats.samples
        self.compute_s += stats.compute_s
        self.comm_s += stats.comm_s
        self.wall_s += stats.wall_s
        self.sent_bytes += stats.sent_bytes
        self.skipped += int(stats.skipped)
        self.steps += 1
        for name, value in stats.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def reduce(self, ctx: WorkerContext) -> dict[str, float]:
        """Collective: sums over ranks. Loss and `train_*` are per sample; times are rank means."""
        names = sorted(self.sums)
        local = [self.loss_sum, self.samples, self.compute_s, self.comm_s, self.wall_s]
        local += [self.sent_bytes, self.skipped]
        local += [self.sums[n] for n in names]
        total = all_reduce_sum(ctx, local)
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
        for name, value in zip(names, total[7:], strict=True):
            metrics[f"train_{name}"] = value / samples
        return metrics
