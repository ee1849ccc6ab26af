"""What a parameter-server worker hands the step loop: the model lives on the servers.

The worker runs the same step loop and driver as every strategy
(`training/steps.py`, `training/driver.py`) with these collaborators: a model
built without tables (on the meta device, then served), a
:class:`~shoal.strategies.parameter_server.learner.ServerLearner` that pulls and
pushes rows, a model of record whose best snapshot the servers hold
(:class:`ServedModel`), the servers' shard files as a checkpoint file part
(:class:`ShardFiles`) and the servers' figures as a results section. After each
validation and each checkpoint the workers meet at a barrier, so that (in
every mode) no worker pushes the next clock before the servers have read or
copied the state of this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from shoal.runtime.collectives import all_reduce_max, all_reduce_sum, barrier
from shoal.runtime.context import WorkerContext
from shoal.strategies.parameter_server.client import RowClient
from shoal.strategies.parameter_server.wire import Op
from shoal.training.state import TrainProgress


class ServedModel:
    """The model of record of a worker: the served model; the best is a servers' snapshot."""

    def __init__(
        self, ctx: WorkerContext, client: RowClient, model: nn.Module, progress: TrainProgress
    ) -> None:
        self.ctx, self.client, self._model, self.progress = ctx, client, model, progress
        self.snapshot_step: int | None = None

    @property
    def model(self) -> nn.Module:
        return self._model

    def validated(self, best: bool) -> None:
        if best:
            if self.ctx.is_main:
                self.client.control(Op.SNAPSHOT, self.progress.global_step)
            self.snapshot_step = self.progress.global_step
        barrier(self.ctx)

    def restore_best(self, saved: Path | None) -> bool:
        """The servers keep the best model of this session only; after a resume whose best
        came before it, the final model is tested."""
        step = self.snapshot_step
        if step is None:
            self.ctx.log.warning(
                "parameter server: the best model (step %s) was found before this run resumed "
                "and is not held by the servers: testing the final model",
                self.progress.best_step,
            )
            return False
        if step != self.progress.global_step:
            if self.ctx.is_main:
                self.client.control(Op.RESTORE, self.progress.global_step)
            barrier(self.ctx)
        return True


class ShardFiles:
    """The tables of a checkpoint: each server writes its shard file into the folder."""

    def __init__(self, ctx: WorkerContext, client: RowClient, progress: TrainProgress) -> None:
        self.ctx, self.client, self.progress = ctx, client, progress

    def write_files(self, folder: Path) -> dict[str, str]:
        answers = self.client.control(Op.SAVE, self.progress.global_step, blob=str(folder).encode())
        return {a["file"]: a["sha256"] for a in answers}

    def written(self) -> None:
        barrier(self.ctx)  # rank 0 sealed the folder: a restarted server may resume from it
        self.client.saved(self.progress.global_step)


def server_section(
    ctx: WorkerContext, client: RowClient, servers_line: str, mode: str, progress: TrainProgress
) -> dict[str, Any]:
    """results.json's `parameter_server` section (collective over the workers);
    `servers_line`: the strategy's one-line description, `mode`: its update mode."""
    totals = all_reduce_sum(ctx, client.stats.as_list())
    servers = client.control(Op.STATS, progress.global_step, fresh=False) if ctx.is_main else []
    train_s = max(progress.train_time_s, 1e-9)
    staleness: dict[str, int] = {}
    for stats in servers:
        for key, count in stats["staleness"].items():
            staleness[key] = staleness.get(key, 0) + count
    pulls, pushes, rows_pulled, rows_pushed, bytes_in, wait_s = totals
    (peak,) = all_reduce_max(ctx, [float(client.held_bytes)])
    return {
        "parameter_server": {
            "servers": servers_line,
            "mode": mode,
            "pulls": pulls,
            "pushes": pushes,
            "rows_per_s": (rows_pulled + rows_pushed) / train_s,
            "pulled_bytes_per_s": bytes_in / train_s,
            "pushed_bytes_per_s": sum(s["bytes_in"] for s in servers) / train_s,
            "barrier_wait_s": wait_s / max(ctx.world_size, 1),
            "server_apply_s": [s["apply_s"] for s in servers],
            "server_held_s": [s["held_s"] for s in servers],
            "rejected_messages": sum(s["rejected"] for s in servers),
            "staleness_histogram": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))),
            "worker_peak_row_bytes": int(peak),
        }
    }
