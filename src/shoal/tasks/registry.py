"""Tasks by name (the `type` of `[task]`)."""

from __future__ import annotations

from collections.abc import Callable

from shoal.registry import Registry
from shoal.runtime.context import WorkerContext
from shoal.tasks.base import Task

TASKS: Registry[Callable[[WorkerContext], Task]] = Registry("task")


def build_task(ctx: WorkerContext) -> Task:
    # Importing the built-in tasks registers them.
    import shoal.tasks.classification.task  # noqa: F401

    return TASKS.get(ctx.config.task.type)(ctx)
