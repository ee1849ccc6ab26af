"""What every worker runs once its context exists, however it was launched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shoal.checkpoint.attempt import promote_config
from shoal.config.custom import section_class
from shoal.monitor.metrics import MetricsLog
from shoal.plugins.kinds import STRATEGIES, TASKS
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import seed_everything
from shoal.runtime.stop import raise_if_stopped
from shoal.shape.roles import RankRoles
from shoal.shape.sizing import shape_of


def run_job(ctx: WorkerContext) -> dict[str, Any]:
    """Build the task (data) and the strategy, and run the strategy's loop.

    The job's shape is computed here once, from the config and the hosts every rank
    reported, and validated against the processes the job has; the strategy's roles are
    its roles. A run that a stop request ended raises RunStopped (exit code 128 +
    signal) once its results are written."""
    shape = shape_of(ctx.config, ctx.hosts)
    ctx = replace(ctx, shape=shape)
    shape.roles.validate(ctx.world_size, f"strategy {ctx.config.strategy.type}")
    seed_everything(ctx.config.train.seed)  # user factories may draw random numbers
    task = section_class(TASKS, ctx.config.task)(ctx)
    strategy = section_class(STRATEGIES, ctx.config.strategy)(ctx, shape)
    if ctx.is_main:
        ctx.log.info("roles: %s", strategy.roles.describe())
        _log_placement(ctx, strategy.roles)
    if ctx.heartbeat is not None:  # `shoal status` shows it
        ctx.heartbeat.role = strategy.roles.role_of(ctx.rank)
    results = strategy.run(task)
    if ctx.is_main:  # a resumed run that wrote no checkpoint still ran with this config
        promote_config(ctx.paths, ctx.config)
    raise_if_stopped(results)
    return results


def _log_placement(ctx: WorkerContext, roles: RankRoles) -> None:
    """A mesh's groups and their hosts: one line in the log, a warning where tensor groups
    span hosts, and a `placement` record in metrics.jsonl (rank 0)."""
    placed = roles.mesh_placement(ctx.hosts)
    if placed is None:
        return
    line, warnings, record = placed
    ctx.log.info("%s", line)
    for warning in warnings:
        ctx.log.warning("%s", warning)
    metrics = MetricsLog(ctx.paths.metrics, enabled=True)
    metrics.write(record)
    metrics.close()
