"""The `population_based` strategy: its own generation loop over members that time-share workers."""

from __future__ import annotations

from typing import Any, ClassVar

from shoal.protocols.task import Task
from shoal.strategies.base import Strategy
from shoal.strategies.population.config import PopulationStrategyConfig
from shoal.strategies.population.loop import PopulationLoop


class PopulationStrategy(Strategy[PopulationStrategyConfig]):
    """Population-based training (Jaderberg et al., 2017).

    Each member is trained by one worker on whole batches (the base strategy's local
    gradient sync); `population_size` may exceed the workers, which then train their
    members in turn. With one worker the population trains in the calling process. The
    generation loop is :class:`PopulationLoop`, run by the one driver.
    """

    config_class: ClassVar[type[PopulationStrategyConfig]] = PopulationStrategyConfig

    def describe(self) -> str:
        c = self.config
        return (
            f"population_based {c.population_size} members on {self.ctx.world_size} "
            f"worker{'s' if self.ctx.world_size > 1 else ''} "
            f"({c.exploit.method}, {c.explore.method})"
        )

    def run(self, task: Task) -> dict[str, Any]:
        peers = self.comm_group()  # collective: before the loop, alike on every rank
        detail = self.describe()
        return self.drive(
            task, lambda run: PopulationLoop(run, self.config, self.roles, peers, detail)
        )
