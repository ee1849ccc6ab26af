"""The task a `[task]` section names (`type`, or `type = "custom"` and its `class`)."""

from __future__ import annotations

from typing import Any

from shoal.config.custom import section_class
from shoal.plugins.kinds import TASKS
from shoal.runtime.context import WorkerContext
from shoal.tasks.base import Task


def task_class(section: Any) -> type[Task]:
    """The class of a validated `[task]` section (or of a task name)."""
    cls: type[Task] = section_class(TASKS, section)
    return cls


def build_task(ctx: WorkerContext) -> Task:
    return task_class(ctx.config.task)(ctx)
