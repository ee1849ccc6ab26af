"""A parameter-server worker's step loop: the model lives on the servers.

The worker runs the same step loop and driver as every strategy
(`training/steps.py`, `training/driver.py`), :class:`ServedStepLoop` changing what
differs: a model built without tables (on the meta device, then served), a
:class:`~shoal.strategies.parameter_server.learner.ServerLearner` that pulls and
pushes rows, a model of record whose best snapshot the servers hold
(:class:`ServedModel`), the servers' shard files as a checkpoint file part
(:class:`ShardFiles`) and the servers' figures as a results section. After each
validation and each checkpoint the workers meet at a barrier, so that (in
every mode) no worker pushes the next clock before the servers have read or
copied the state of this one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.integrity import read_meta
from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.parts import FilePart
from shoal.errors import ShoalError
from shoal.runtime.collectives import all_reduce_max, all_reduce_sum, barrier
from shoal.runtime.context import WorkerContext
from shoal.strategies.parameter_server.client import RowClient
from shoal.strategies.parameter_server.config import ParameterServerStrategyConfig
from shoal.strategies.parameter_server.learner import ServedRows, ServerLearner, ServerSync
from shoal.strategies.parameter_server.wire import Op
from shoal.training.contracts import GradientSync
from shoal.training.loop import ModelOfRecord, Run
from shoal.training.state import TrainProgress
from shoal.training.steps import StepLoop


class ServedModel:
    """The model of record of a worker: the served model; the best is a servers' snapshot,
    and a checkpoint in best/ (`checkpoint.keep_best`) for a server that lost it."""

    def __init__(
        self, ctx: WorkerContext, client: RowClient, model: nn.Module, progress: TrainProgress
    ) -> None:
        self.ctx, self.client, self._model, self.progress = ctx, client, model, progress

    @property
    def model(self) -> nn.Module:
        return self._model

    def validated(self, best: bool) -> None:
        if best and self.ctx.is_main:
            self.client.control(Op.SNAPSHOT, self.progress.global_step)
        barrier(self.ctx)

    def restore_best(self, saved: Path | None) -> bool:
        """Collective: the servers put the best model back, each from its snapshot or, if it
        lost it (restarted after that evaluation, alone or with the job, or a run resumed
        since), from the best checkpoint. Without that checkpoint (keep_best = false) and a
        server that lost its snapshot, no server changes anything: the final model is
        tested, and a warning says why."""
        p = self.progress
        if p.best_step == p.global_step:
            return True  # the tables are the best model
        folder = _best_folder(saved, self.ctx.paths.best, p.best_step)
        ok = 0.0
        if self.ctx.is_main:
            held = [] if folder else self.client.control(Op.STATS, p.global_step, fresh=False)
            lost = [i for i, s in enumerate(held) if s["snapshot_clock"] != p.best_step]
            if lost:
                self.ctx.log.warning(
                    "parameter server: the best model (step %s) is held by no checkpoint "
                    "(checkpoint.keep_best = false) and server(s) %s lost its snapshot "
                    "(restarted since): testing the final model",
                    p.best_step,
                    ", ".join(map(str, lost)),
                )
            else:
                blob = json.dumps({"clock": p.best_step, "folder": str(folder or "")})
                self.client.control(Op.RESTORE, p.global_step, blob=blob.encode())
                ok = 1.0
        (restored,) = all_reduce_max(self.ctx, [ok])  # every worker returns rank 0's word
        return bool(restored)


def _best_folder(saved: Path | None, best: Path, step: int | None) -> Path | None:
    """The checkpoint of the best model (`saved`, else the newest in best/) if it is of
    `step`; None if there is none (keep_best = false) or it is of another step (a failed
    attempt found a better model that this one has not reached again)."""
    found = [saved] if saved is not None else list_checkpoints(best)[-1:]
    for folder in found:
        try:
            if int(read_meta(folder).get("step", -1)) == step:
                return folder
        except ShoalError:
            return None
    return None


class ShardFiles:
    """The tables of a checkpoint: each server writes its shard file into the folder."""

    def __init__(self, ctx: WorkerContext, client: RowClient, progress: TrainProgress) -> None:
        self.ctx, self.client, self.progress = ctx, client, progress
        self._folder: Path | None = None  # rank 0: the folder being written

    def write_files(self, folder: Path) -> dict[str, str]:
        self._folder = folder
        answers = self.client.control(Op.SAVE, self.progress.global_step, blob=str(folder).encode())
        return {a["file"]: a["sha256"] for a in answers}

    def written(self) -> None:
        """Rank 0 sealed the folder (this all-reduce is the workers' barrier): a restarted
        server may resume from it, and the workers forget the pushes it makes useless
        (rejoin.py's PushLog) — unless it is best/'s. The best model is no state a server
        resumes from (newest_state never picks it), so forgetting pushes for it would leave
        a server restarted from an older checkpoint without the replay it needs."""
        folder, self._folder = self._folder, None
        best = folder is not None and folder.parent == self.ctx.paths.best
        (any_best,) = all_reduce_max(self.ctx, [float(best)])  # rank 0's word, to every worker
        if not any_best:
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
            "server_build_peak_bytes": [s.get("build_peak_bytes") for s in servers],
            "rejected_messages": sum(s["rejected"] for s in servers),
            "staleness_histogram": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))),
            "worker_peak_row_bytes": int(peak),
        }
    }


class ServedStepLoop(StepLoop):
    """The step loop of a worker whose model's tables live on the servers."""

    def __init__(self, run: Run, strategy: Any, client: RowClient, served: ServedRows) -> None:
        """`strategy`: the parameter-server strategy (its gradient sync, its description)."""
        self.client, self.served = client, served
        self.section_config: ParameterServerStrategyConfig = strategy.config
        super().__init__(run, strategy)

    def build_model(self) -> nn.Module:
        """The shapes only, on the meta device: `attach` serves the rows."""
        with torch.device("meta"):
            return self.task.build_model()

    def make_learner(self, model: nn.Module, sync: GradientSync) -> ServerLearner:
        assert isinstance(sync, ServerSync)
        config = self.section_config
        learner = ServerLearner(
            self.task,
            model,
            sync,
            self.served,
            self.train,
            config,
            (self.ctx.rank, config.num_workers),
        )
        learner.total_steps = self.total_steps
        return learner

    def make_record(self) -> ModelOfRecord:
        return ServedModel(self.ctx, self.client, self.learner.model, self.progress)

    def file_parts(self) -> list[FilePart]:
        return [ShardFiles(self.ctx, self.client, self.progress)]

    def after_restore(self) -> None:
        """The clocks go on from the resumed step."""
        step = self.progress.global_step
        self.client.resume_at(step)
        self.served.clock = step

    def section(self) -> dict[str, Any]:
        config = self.section_config
        servers = server_section(
            self.ctx, self.client, self.strategy.describe(), config.mode, self.progress
        )
        return {**super().section(), **servers}
