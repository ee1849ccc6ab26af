"""What every worker runs once its context exists, however it was launched."""

from __future__ import annotations

from typing import Any

from shoal.checkpoint.attempt import promote_config
from shoal.monitor.metrics import MetricsLog
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import seed_everything
from shoal.runtime.roles import RankRoles
from shoal.runtime.stop import raise_if_stopped
from shoal.strategies.registry import strategy_class
from shoal.tasks.registry import build_task


def run_job(ctx: WorkerContext) -> dict[str, Any]:
    """Build the task (data) and the strategy, and run the strategy's loop.

    A run that a stop request ended raises RunStopped (exit code 128 + signal) once its
    results are written."""
    seed_everything(ctx.config.train.seed)  # user factories may draw random numbers
    task = build_task(ctx)
    strategy = strategy_class(ctx.config.strategy)(ctx)
    strategy.roles.validate(ctx.world_size, f"strategy {ctx.config.strategy.type}")
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
