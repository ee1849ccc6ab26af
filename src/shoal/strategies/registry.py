"""Strategies by name (the `type` of `[strategy]`)."""

from __future__ import annotations

from shoal.registry import Registry
from shoal.strategies.base import Strategy
from shoal.strategies.data_parallel import DataParallelStrategy
from shoal.strategies.federated.strategy import FederatedStrategy
from shoal.strategies.local import LocalStrategy

STRATEGIES: Registry[type[Strategy]] = Registry("strategy")
STRATEGIES.add("local", LocalStrategy)
STRATEGIES.add("data_parallel", DataParallelStrategy)
STRATEGIES.add("federated", FederatedStrategy)


def strategy_class(name: str) -> type[Strategy]:
    return STRATEGIES.get(name)
