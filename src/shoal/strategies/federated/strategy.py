"""`federated`: clients train locally on private shards; the global model moves by their update.

The strategy says how many workers, how gradients behave inside a client (they
stay local) and what may change on resume; the round loop is
:class:`~shoal.strategies.federated.loop.FederatedLoop`, run by the one driver.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from shoal.config.root import ShoalConfig
from shoal.runtime.roles import RankRoles
from shoal.strategies.base import Strategy
from shoal.strategies.federated.config import FederatedStrategyConfig
from shoal.strategies.federated.loop import FederatedLoop
from shoal.tasks.base import Task
from shoal.training.contracts import GradientSync, LocalGradientSync


class FederatedStrategy(Strategy):
    """Clients train locally on private shards; the global model moves by their averaged update."""

    config_class: ClassVar[type[FederatedStrategyConfig]] = FederatedStrategyConfig

    in_process: ClassVar[bool] = True  # with one worker: no process group, nothing crosses

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        assert isinstance(config.strategy, FederatedStrategyConfig)
        return config.strategy.workers

    workers_field: ClassVar[str | None] = "workers"
    #: a worker given up (`[faults] min_workers`) takes no client with it: client c lives on
    #: worker c mod workers, so the next attempt hosts the lost worker's clients on the
    #: others, and every draw of a round is seeded by (seed, round, client), not by worker.
    #: A round then equals the same round of a run that had that assignment from the
    #: start (the sum of updates is grouped per worker, then over workers in rank order:
    #: fixed for an assignment, but not the grouping of a run with more workers)
    elastic: ClassVar[bool] = True
    resume_safe: ClassVar[tuple[str, ...]] = (
        "rounds",
        "balance",  # the clients' sum is exact: any placement gives the same model
        "eval_every_rounds",
        "round_timeout_s",
        "audit_wire",
        "inject",
    )

    @property
    def config(self) -> FederatedStrategyConfig:
        config = self.ctx.config.strategy
        assert isinstance(config, FederatedStrategyConfig)
        return config

    def attach(self, model: nn.Module) -> GradientSync:
        """Clients' gradients stay local (FedProx adds its term through the aggregation)."""
        return LocalGradientSync(model)

    def describe(self) -> str:
        c = self.config
        return f"federated x{self.ctx.world_size} ({c.num_clients} clients, {c.aggregation.method})"

    def make_roles(self) -> RankRoles:
        """Client c lives on worker c mod workers."""
        return RankRoles.hosting(self.ctx.world_size, "client", self.config.num_clients)

    def run(self, task: Task) -> dict[str, Any]:
        loop = FederatedLoop(
            self.ctx, task, self.config, self.roles, self.comm_group(), self.describe()
        )
        return self.drive(task, loop)
