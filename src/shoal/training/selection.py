"""Model selection, for every task and every strategy: the best model and early stopping.

Each validation is compared with the best so far by the task's `primary_metric`
on its first evaluation split; an improvement is kept by the loop's model of
record (in memory, on the servers, ...) and, with `checkpoint.keep_best`, in
`best/` (written atomically); `train.early_stopping_patience` evaluations
without one end training. After training the best model is put back for the
test splits and the artifacts. Every rank takes the same decisions: evaluation
results are identical on all ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.checkpoint.manager import CheckpointManager, list_checkpoints
from shoal.protocols.task import Task
from shoal.runtime.context import WorkerContext
from shoal.training.loop import ModelOfRecord
from shoal.training.state import TrainProgress


class Selection:
    def __init__(
        self,
        ctx: WorkerContext,
        task: Task,
        progress: TrainProgress,
        record: ModelOfRecord,
        save_best: Callable[[CheckpointManager], Path | None],
        criterion: tuple[str, str, str] | None = None,
    ) -> None:
        self.ctx, self.task, self.progress, self.record = ctx, task, progress, record
        if criterion is None:
            splits = task.eval_splits()
            criterion = (splits[0] if splits else "", *task.primary_metric)
        #: (split, metric, "max" | "min"): the validation figure that selects the best model
        self.criterion = criterion
        self.save_best = save_best
        self.manager = CheckpointManager(ctx, 1, ctx.paths.best)
        self.checkpoint: Path | None = None
        self.kept = False  # this session kept a best model
        self.message = ""

    def track(self, figures: dict[str, dict[str, float]]) -> bool:
        """Compare the latest validation with the best so far; keep it or count towards
        patience. True when patience ran out (`message` says why)."""
        was_stopped = self.progress.stopped_early
        best = self._improved(figures)
        self.record.validated(best)
        if best and self.ctx.config.checkpoint.keep_best:
            path = self.save_best(self.manager)
            if path is not None:
                self.checkpoint = path
        return self.progress.stopped_early and not was_stopped

    def _improved(self, figures: dict[str, dict[str, float]]) -> bool:
        split, name, direction = self.criterion
        value = figures.get(split, {}).get(name) if split else None
        if value is None or math.isnan(value):
            return False
        p = self.progress
        delta = self.ctx.config.train.early_stopping_min_delta
        if p.best_metric is None or (
            value > p.best_metric + delta if direction == "max" else value < p.best_metric - delta
        ):
            p.best_metric, p.best_step, p.evals_without_improvement = value, p.global_step, 0
            self.kept = True
            return True
        p.evals_without_improvement += 1
        patience = self.ctx.config.train.early_stopping_patience
        if patience is None or p.evals_without_improvement < patience:
            return False
        p.stopped_early = True
        self.message = (
            f"early stop at step {p.global_step}: {split} {name} has not improved for "
            f"{patience} evaluations (best {p.best_metric:.4f} at step {p.best_step})"
        )
        return False

    def restore_best(self) -> int:
        """Collective: put the best model in place; returns the step of the model in place."""
        p = self.progress
        if p.best_metric is None:
            return p.global_step
        saved = None
        if not self.kept:  # a resumed run whose best came before this session
            found = list_checkpoints(self.ctx.paths.best)
            saved = found[-1] if found else None
            self.checkpoint = saved
        return p.best_step if self.record.restore_best(saved) else p.global_step

    def summary(self) -> dict[str, Any] | None:
        p = self.progress
        if p.best_metric is None:
            return None
        return {
            "metric": self.criterion[1],
            "value": p.best_metric,
            "step": p.best_step,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
        }
