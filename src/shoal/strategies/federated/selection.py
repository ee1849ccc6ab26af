"""Who takes part in a round: all clients, a seeded random subset, or those with given tags.

Every worker computes the selection itself from the config and the round number,
so all agree on it without communicating, and a resumed run selects the same
clients as one that never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from shoal.plugins.registry import closed_choice
from shoal.strategies.federated.config import (
    AllClientsConfig,
    ByCapabilityConfig,
    FederatedStrategyConfig,
    RandomClientsConfig,
)

#: (selection config, strategy config, seed, round) -> sorted client ids
Selector = Callable[[Any, FederatedStrategyConfig, int, int], list[int]]


def select_all(
    _: AllClientsConfig, strategy: FederatedStrategyConfig, seed: int, rnd: int
) -> list[int]:
    return list(range(strategy.num_clients))


def select_random(
    config: RandomClientsConfig, strategy: FederatedStrategyConfig, seed: int, rnd: int
) -> list[int]:
    """max(min_clients, floor(fraction * n)) distinct clients, drawn from (seed, round)."""
    n = strategy.num_clients
    count = min(n, max(config.min_clients, math.floor(config.fraction * n + 1e-9)))
    picked = np.random.default_rng([seed, rnd, 0x5E1EC7]).choice(n, size=count, replace=False)
    return sorted(int(c) for c in picked)


def select_by_capability(
    config: ByCapabilityConfig, strategy: FederatedStrategyConfig, seed: int, rnd: int
) -> list[int]:
    required = set(config.required_tags)
    return [c for c, tags in enumerate(strategy.tags_of()) if required <= tags]


def select_clients(strategy: FederatedStrategyConfig, seed: int, rnd: int) -> list[int]:
    """The clients selected for round `rnd`, sorted."""
    selection = strategy.client_selection
    select: Selector = SELECTIONS.load(selection.method)
    return select(selection, strategy, seed, rnd)


SELECTIONS = closed_choice(
    "client selection method",
    "method",
    "shoal.strategies.federated.selection",
    "shoal.strategies.federated.config",
    {
        "all": ("select_all", "AllClientsConfig"),
        "random": ("select_random", "RandomClientsConfig"),
        "by_capability": ("select_by_capability", "ByCapabilityConfig"),
    },
)
"""The client selection methods, by their config's `method`."""
