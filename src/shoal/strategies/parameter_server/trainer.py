"""The shared training loop on a parameter-server worker.

The :class:`~shoal.training.trainer.Trainer` runs unchanged around a
:class:`ServerLearner`; what differs is where the model lives. The worker's
model is built without tables (on the meta device, then `serve_tables`), the
best model is a snapshot the servers keep, and a checkpoint's tables are the
servers' shard files, written into the checkpoint folder before it is renamed
into place. After evaluation, a snapshot and a checkpoint the workers meet at a
barrier, so that (in every mode) no worker pushes the next clock before the
servers have read or copied the state of this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from shoal.checkpoint.manager import CheckpointManager
from shoal.runtime.collectives import all_reduce_max, all_reduce_sum, barrier
from shoal.strategies.parameter_server.learner import ServerLearner
from shoal.strategies.parameter_server.wire import Op
from shoal.training.contracts import GradientSync
from shoal.training.trainer import Trainer

if TYPE_CHECKING:
    from shoal.strategies.parameter_server.strategy import ParameterServerStrategy


class ServerTrainer(Trainer):
    strategy: ParameterServerStrategy

    def _build_model(self) -> nn.Module:
        with torch.device("meta"):  # the shapes only: the rows live on the servers
            return self.task.build_model()

    def _make_learner(self, model: nn.Module, sync: GradientSync) -> ServerLearner:  # type: ignore[override]
        learner = self.strategy.make_learner(self.task, model, sync)
        learner.total_steps = self.total_steps
        return learner

    def _restore(self, path: Path) -> None:
        super()._restore(path)
        self.strategy.resume_clock(self.progress.global_step)

    # ------------------------------------------------------------ model selection
    def _track_best(self) -> None:
        before = (self.progress.best_step, self.progress.best_metric)
        super()._track_best()
        if (self.progress.best_step, self.progress.best_metric) != before:
            if self.ctx.is_main:
                self.strategy.client.control(Op.SNAPSHOT, self.progress.global_step)
            self._snapshot_step = self.progress.global_step
        barrier(self.ctx)

    def _load_best_state(self) -> dict[str, torch.Tensor] | None:
        """The servers keep the best model of this session only; after a resume whose best
        came before it, the final model is tested."""
        self.ctx.log.warning(
            "parameter server: the best model (step %s) was found before this run resumed and "
            "is not held by the servers: testing the final model",
            self.progress.best_step,
        )
        return None

    def _test_and_save_artifacts(self) -> None:
        step = getattr(self, "_snapshot_step", None)
        if step is not None and step != self.progress.global_step:
            if self.ctx.is_main:
                self.strategy.client.control(Op.RESTORE, self.progress.global_step)
            barrier(self.ctx)
        super()._test_and_save_artifacts()

    # ------------------------------------------------------------ checkpoints
    def _save(self, manager: CheckpointManager | None = None) -> None:
        super()._save(manager)
        barrier(self.ctx)

    def _checkpoint_files(self, folder: Path) -> dict[str, str]:
        answers = self.strategy.client.control(
            Op.SAVE, self.progress.global_step, blob=str(folder).encode()
        )
        return {a["file"]: a["sha256"] for a in answers}

    # ------------------------------------------------------------ results
    def _results(self, wall_s: float) -> dict[str, Any]:
        results = super()._results(wall_s)
        client = self.strategy.client
        totals = all_reduce_sum(self.ctx, client.stats.as_list())
        servers = (
            client.control(Op.STATS, self.progress.global_step, fresh=False)
            if self.ctx.is_main
            else []
        )
        train_s = max(self.progress.train_time_s, 1e-9)
        staleness: dict[str, int] = {}
        for stats in servers:
            for key, count in stats["staleness"].items():
                staleness[key] = staleness.get(key, 0) + count
        pulls, pushes, rows_pulled, rows_pushed, bytes_in, wait_s = totals
        (peak,) = all_reduce_max(self.ctx, [float(client.held_bytes)])
        results["parameter_server"] = {
            "servers": self.strategy.describe(),
            "mode": self.strategy.config.mode,
            "pulls": pulls,
            "pushes": pushes,
            "rows_per_s": (rows_pulled + rows_pushed) / train_s,
            "pulled_bytes_per_s": bytes_in / train_s,
            "pushed_bytes_per_s": sum(s["bytes_in"] for s in servers) / train_s,
            "barrier_wait_s": wait_s / max(self.ctx.world_size, 1),
            "server_apply_s": [s["apply_s"] for s in servers],
            "server_held_s": [s["held_s"] for s in servers],
            "rejected_messages": sum(s["rejected"] for s in servers),
            "staleness_histogram": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))),
            "worker_peak_row_bytes": int(peak),
        }
        return results
