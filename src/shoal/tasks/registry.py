"""Tasks by name (the `type` of `[task]`)."""

from __future__ import annotations

from collections.abc import Callable

from shoal.registry import Registry
from shoal.runtime.context import WorkerContext
from shoal.tasks.base import Task
from shoal.tasks.classification.task import ClassificationTask
from shoal.tasks.kge.task import KGETask
from shoal.tasks.lm.task import LMTask

TASKS: Registry[Callable[[WorkerContext], Task]] = Registry("task")
TASKS.add("classification", ClassificationTask)
TASKS.add("kge", KGETask)
TASKS.add("lm", LMTask)


def build_task(ctx: WorkerContext) -> Task:
    return TASKS.get(ctx.config.task.type)(ctx)
