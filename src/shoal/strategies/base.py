"""The strategy interface: one object decides how the work is distributed.

A strategy answers three questions: how many worker processes it needs, what
happens to gradients between backward and the optimizer step (`attach` returns a
:class:`~shoal.training.contracts.GradientSync`), and what the job loop is
(`run`; by default the step loop, `training/steps.py`, under the one driver,
`training/driver.py`). `local` and `data_parallel` differ only in the gradient
sync; a strategy with another unit (federated rounds) gives the driver its own
:class:`~shoal.training.loop.UnitLoop`, and one whose model lives elsewhere (the
parameter server) gives the step loop its collaborators.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel
from torch import nn

from shoal.config.root import ShoalConfig
from shoal.errors import ConfigError
from shoal.runtime.context import WorkerContext
from shoal.runtime.roles import RankRoles
from shoal.tasks.base import Task
from shoal.training.contracts import GradientSync
from shoal.training.driver import Driver
from shoal.training.steps import StepLoop


class Strategy(ABC):
    """Base of every strategy; subclasses register under their config's `type`.

    A strategy is a plugin (`shoal.plugins`): shoal's own are listed in
    `plugins/kinds.py`, others come from a `shoal.strategies` entry point or a
    `[strategy] type = "custom"` dotted path. `config_class` is the pydantic model
    of its `[strategy]` table (of `[strategy.config]` under `type = "custom"`).
    """

    #: the pydantic model of this strategy's config section
    config_class: ClassVar[type[BaseModel]]

    #: True when the strategy can run inside the calling process (no worker processes)
    in_process: ClassVar[bool] = False

    #: the `[strategy]` field that `--workers N` sets (None: the strategy runs one process)
    workers_field: ClassVar[str | None] = None

    #: `[strategy]` fields (patterns, e.g. "sharding.*") a resume may change freely: they
    #: change neither the problem nor the saved state's shape (the workers field is one)
    resume_safe: ClassVar[tuple[str, ...]] = ()
    #: `[strategy]` fields whose change the saved state cannot load into: always refused.
    #: Any field in neither list changes the problem and needs --allow-changes.
    resume_incompatible: ClassVar[tuple[str, ...]] = ()
    #: strategies of one family keep the same checkpoint parts, the model and optimizer by
    #: parameter name ("learner": local, data_parallel and the SPMD strategies), so a resume
    #: may switch between them (`checkpoint/changes.py`); None: only to itself
    state_family: ClassVar[str | None] = None

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.roles = self.make_roles()

    def make_roles(self) -> RankRoles:
        """Which rank does what (`runtime/roles.py`); by default every rank trains."""
        return RankRoles.replicas(self.ctx.world_size)

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        """Worker processes the local launcher starts for this config."""
        return 1

    @classmethod
    def workers_override(cls, workers: int, section: str = "strategy") -> list[str]:
        """The `--set` items that make this strategy start `workers` worker processes
        (`section`: where its config lives, "strategy.config" under `type = "custom"`)."""
        if cls.workers_field is not None:
            return [f"{section}.{cls.workers_field}={workers}"]
        if workers == 1:
            return []
        name = cls.__name__.removesuffix("Strategy").lower()
        raise ConfigError(
            f"--workers {workers}: strategy '{name}' runs one process; set "
            '[strategy] type = "data_parallel" to train on several workers'
        )

    @classmethod
    def check(cls, config: ShoalConfig) -> None:
        """Checks across config sections that no single section can make; raise ConfigError."""
        return None

    @abstractmethod
    def attach(self, model: nn.Module) -> GradientSync:
        """Prepare `model` for training under this strategy and return its gradient sync."""

    def state_dict(self) -> dict[str, Any]:
        """Strategy state to checkpoint (e.g. compression residuals)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what `state_dict` returned."""

    def describe(self) -> str:
        return self.ctx.config.strategy.type

    def run(self, task: Task) -> dict[str, Any]:
        """The job: by default the shared training loop."""
        return Driver(self.ctx, task, StepLoop(self.ctx, task, self), self.describe()).run()
