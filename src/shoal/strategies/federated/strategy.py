"""`federated`: clients train locally on private shards; the global model moves by their update.

Its shape (workers, clients dealt over them, elastic membership) and what may
change on resume are its config section's; the round loop is
:class:`~shoal.strategies.federated.loop.FederatedLoop`, run by the one driver.
Clients' gradients stay local (FedProx adds its term through the aggregation):
the base strategy's gradient sync.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shoal.protocols.task import Task
from shoal.strategies.base import Strategy
from shoal.strategies.federated.config import FederatedStrategyConfig
from shoal.strategies.federated.loop import FederatedLoop


class FederatedStrategy(Strategy[FederatedStrategyConfig]):
    """Clients train locally on private shards; the global model moves by their averaged update."""

    config_class: ClassVar[type[FederatedStrategyConfig]] = FederatedStrategyConfig

    def describe(self) -> str:
        c = self.config
        return f"federated x{self.ctx.world_size} ({c.num_clients} clients, {c.aggregation.method})"

    def run(self, task: Task) -> dict[str, Any]:
        wire = self.comm_group()  # collective: before the loop, alike on every rank
        detail = self.describe()
        return self.drive(
            task, lambda run: FederatedLoop(run, self.config, self.roles, wire, detail)
        )
