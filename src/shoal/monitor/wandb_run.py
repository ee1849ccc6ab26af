"""A Weights & Biases run with the scalars of metrics.jsonl (`[monitor] wandb = {...}`).

Rank 0 starts one run per training session (`wandb.init`), with the resolved config as the
run's config, and logs each record's scalars (`monitor/scalars.py`) as one history row. W&B
wants its own `_step` to grow with every call, while several of shoal's records share a step
(a generation's member lines, an evaluation at a logged step): shoal's step therefore goes in
as a metric of its own, `step`, which every other metric is drawn against (`define_metric`),
so no row is merged into or dropped for another. The run ends with the session, with exit
code 0 (completed), 1 (failed) or 143 (stopped by a signal), so the W&B UI shows how it ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError
from shoal.monitor.scalars import Outcome

if TYPE_CHECKING:
    from shoal.config.trackers import WandbConfig
    from shoal.runtime.context import WorkerContext

#: the metric that holds shoal's step, the x axis of every other one
STEP = "step"
EXIT_CODES: dict[Outcome, int] = {"completed": 0, "failed": 1, "stopped": 143}


class WandbRun:
    """One W&B run, fed by :class:`~shoal.monitor.metrics.MetricsLog` on rank 0."""

    def __init__(self, settings: WandbConfig, ctx: WorkerContext) -> None:
        import wandb  # the optional extra, checked when the config was validated

        try:
            self._run = wandb.init(
                project=settings.project,
                entity=settings.entity,
                name=settings.name or ctx.paths.root.name,
                group=settings.group,
                tags=settings.tags or None,
                notes=settings.notes,
                mode=settings.mode,
                dir=settings.dir or str(ctx.paths.root),
                job_type="train",
                config=ctx.config.model_dump(mode="json", exclude_none=True),
                # shoal keeps its own per-rank logs: W&B leaves stdout and stderr alone
                settings=wandb.Settings(console="off"),
            )
        except Exception as error:  # wandb's errors: not logged in, no network, bad entity
            raise ShoalError(
                f"monitor.wandb: W&B did not start a run: {_one_line(error)} "
                '(log in with `wandb login`, or set mode = "offline")'
            ) from error
        self._run.define_metric(STEP)
        self._run.define_metric("*", step_metric=STEP)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if scalars:
            self._run.log({STEP: step, **scalars})

    def close(self, outcome: Outcome) -> None:
        self._run.finish(exit_code=EXIT_CODES[outcome])


def _one_line(error: Any) -> str:
    return " ".join(str(error).split()) or type(error).__name__
