"""The `population_based` strategy: its own generation loop over members that time-share workers."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from shoal.config.root import ShoalConfig
from shoal.errors import ConfigError
from shoal.runtime.roles import RankRoles
from shoal.strategies.base import Strategy
from shoal.strategies.population.config import PopulationStrategyConfig
from shoal.strategies.population.hyperparams import check_search_space
from shoal.strategies.population.loop import PopulationLoop, resolve_metric
from shoal.tasks.base import Task
from shoal.tasks.registry import task_class as _task_class
from shoal.training.contracts import GradientSync, LocalGradientSync


class PopulationStrategy(Strategy):
    """Population-based training (Jaderberg et al., 2017).

    Each member is trained by one worker on whole batches (a local gradient
    sync); `population_size` may exceed the workers, which then train their
    members in turn. With one worker the population trains in the calling
    process. The generation loop is :class:`PopulationLoop`, run by the one driver.
    """

    config_class: ClassVar[type[PopulationStrategyConfig]] = PopulationStrategyConfig

    in_process: ClassVar[bool] = True
    workers_field: ClassVar[str | None] = "workers"
    #: a member moves with its whole state: placement changes nothing it computes
    resume_safe: ClassVar[tuple[str, ...]] = ("generations", "checkpoint_every", "balance")
    resume_incompatible: ClassVar[tuple[str, ...]] = ("population_size",)

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        assert isinstance(config.strategy, PopulationStrategyConfig)
        return config.strategy.workers

    @classmethod
    def check(cls, config: ShoalConfig) -> None:
        """The search space names hyperparameters this optimizer and task have; the metric's
        direction is known."""
        assert isinstance(config.strategy, PopulationStrategyConfig)
        if config.train.lr_decay == "plateau":
            raise ConfigError(
                'train.lr_decay = "plateau" follows the trainer\'s validation, which population '
                "members do not run; use constant, linear or cosine (and tune lr in the search "
                "space)"
            )
        check_search_space(config)
        resolve_metric(config.strategy, _task_class(config.task))

    @property
    def config(self) -> PopulationStrategyConfig:
        config = self.ctx.config.strategy
        assert isinstance(config, PopulationStrategyConfig)
        return config

    def attach(self, model: nn.Module) -> GradientSync:
        return LocalGradientSync(model)

    def describe(self) -> str:
        c = self.config
        return (
            f"population_based {c.population_size} members on {self.ctx.world_size} "
            f"worker{'s' if self.ctx.world_size > 1 else ''} "
            f"({c.exploit.method}, {c.explore.method})"
        )

    def make_roles(self) -> RankRoles:
        """Member m lives on worker m mod workers; every worker holds one at least."""
        size = self.config.population_size
        field = "strategy.population_size"
        return RankRoles.hosting(self.ctx.world_size, "member", size, items_field=field)

    def run(self, task: Task) -> dict[str, Any]:
        loop = PopulationLoop(
            self.ctx, task, self.config, self.roles, self.comm_group(), self.describe()
        )
        return self.drive(task, loop)
