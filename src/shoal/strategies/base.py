"""The strategy interface: what runs inside a worker to distribute the work.

Everything decided from the config alone (how many processes, who does what,
how the job shrinks or grows, what a resume may change) is the strategy's
*config section*'s (`config/base.py` `StrategySection`, `shape/`), asked by the
launcher, the planner and recovery without importing this. What is left here
runs in the worker: what happens to gradients between backward and the
optimizer step (`attach` returns a :class:`~shoal.training.contracts.GradientSync`)
and what the job loop is (`run`; by default the step loop, `training/steps.py`,
under the one driver, `training/driver.py`). `local` and `data_parallel` differ
only in the gradient sync; a strategy with another unit (federated rounds) gives
the driver its own :class:`~shoal.training.loop.UnitLoop`, and one whose model
lives elsewhere (the parameter server) runs the step loop with its own learner.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, ClassVar, Generic, TypeVar

import torch
from pydantic import BaseModel
from torch import nn

from shoal.comm.links import CommGroup
from shoal.config.custom import own_config
from shoal.protocols.task import Task
from shoal.runtime.context import WorkerContext
from shoal.shape.job import JobShape
from shoal.shape.sizing import shape_of
from shoal.training.contracts import GradientSync, LocalGradientSync
from shoal.training.driver import Driver, LoopFactory
from shoal.training.steps import StepLoop

C = TypeVar("C", bound=BaseModel)


class Strategy(ABC, Generic[C]):
    """Base of every strategy, generic in its config section's type (`self.config`).

    A strategy is a plugin (`shoal.plugins`): shoal's own are listed in
    `plugins/kinds.py`, others come from a `shoal.strategies` entry point (whose config
    section names this class in `implementation`) or a `[strategy] type = "custom"`
    dotted path (this class, whose `config_class` names its section).
    """

    #: the pydantic model of this strategy's config section (a `StrategySection`)
    config_class: ClassVar[type[BaseModel]]

    def __init__(self, ctx: WorkerContext, shape: JobShape | None = None) -> None:
        """`shape`: the job's, as the worker computed it once (default: from the config)."""
        self.ctx = ctx
        self.config: C = own_config(ctx.config.strategy)
        self.shape = shape if shape is not None else shape_of(ctx.config, ctx.hosts)
        self.roles = self.shape.roles

    def attach(self, model: nn.Module) -> GradientSync:
        """Prepare `model` for training under this strategy and return its gradient sync
        (by default gradients stay local: one process, or each member its own)."""
        return LocalGradientSync(model)

    def state_dict(self) -> dict[str, Any]:
        """Strategy state to checkpoint (e.g. compression residuals)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def describe(self) -> str:
        """The strategy as the log and results.json name it."""
        return str(self.ctx.config.strategy.type)

    def run(self, task: Task) -> dict[str, Any]:
        """The job: by default the shared step loop."""
        return self.drive(task, lambda run: StepLoop(run, self))

    def comm_group(self, backend: str | None = None) -> CommGroup:
        """Collective (every rank, in the same order): a private group for this strategy's
        messages, whose waits time out after `faults.timeout_s` (`comm/links.py`). `backend`:
        another than the job's (the parameter server's rows go over gloo, on the CPU)."""
        ctx = self.ctx
        device = ctx.comm_device if backend is None else torch.device("cpu")
        timeout_s = ctx.config.faults.timeout_s
        return CommGroup.create(ctx.rank, ctx.world_size, ctx.hosts, timeout_s, backend, device)

    def drive(
        self, task: Task, make_loop: LoopFactory, ctx: WorkerContext | None = None
    ) -> dict[str, Any]:
        """Run the loop `make_loop` builds under the one driver (`ctx`: this rank's, or a
        role's own context)."""
        return Driver(ctx or self.ctx, task, make_loop, self.describe()).run()
