"""The scalar sinks a training session opens on rank 0: TensorBoard, W&B, MLflow.

What `[monitor]` asks for is opened when the driver starts (a tracker that cannot start
fails the run at once, before any training, with one line), fed by metrics.jsonl's writer,
and closed when the session ends, completed, failed or stopped.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from shoal.monitor.scalars import ScalarSink

if TYPE_CHECKING:
    from shoal.runtime.context import WorkerContext


def open_sinks(ctx: WorkerContext) -> list[ScalarSink]:
    """The sinks of `ctx.config.monitor`, on the main rank; none elsewhere."""
    if not ctx.is_main:
        return []
    monitor = ctx.config.monitor
    sinks: list[ScalarSink] = []
    try:
        if monitor.tensorboard:
            from shoal.monitor.tensorboard import ScalarWriter

            sinks.append(ScalarWriter(ctx.paths.tensorboard))
        if monitor.wandb is not None:
            from shoal.monitor.wandb_run import WandbRun

            sinks.append(WandbRun(monitor.wandb, ctx))
        if monitor.mlflow is not None:
            from shoal.monitor.mlflow_run import MlflowRun

            sinks.append(MlflowRun(monitor.mlflow, ctx))
    except BaseException:
        for sink in sinks:  # those already open end as failed, not left running
            with contextlib.suppress(Exception):
                sink.close("failed")
        raise
    return sinks
