"""Strategies by name (the `type` of `[strategy]`)."""

from __future__ import annotations

from shoal.registry import Registry
from shoal.strategies.base import Strategy
from shoal.strategies.data_parallel import DataParallelStrategy
from shoal.strategies.federated.strategy import FederatedStrategy
from shoal.strategies.local import LocalStrategy
from shoal.strategies.parameter_server.strategy import ParameterServerStrategy
from shoal.strategies.population.strategy import PopulationStrategy

STRATEGIES: Registry[type[Strategy]] = Registry("strategy")
STRATEGIES.add("local", LocalStrategy)
STRATEGIES.add("data_parallel", DataParallelStrategy)
STRATEGIES.add("federated", FederatedStrategy)
STRATEGIES.add("population_based", PopulationStrategy)
STRATEGIES.add("parameter_server", ParameterServerStrategy)


def strategy_class(name: str) -> type[Strategy]:
    return STRATEGIES.get(name)
