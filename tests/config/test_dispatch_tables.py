"""Every closed config choice has exactly one implementation, and every implementation a choice.

Six choices inside a strategy or task (federated aggregation, client selection and
partition; population exploit and explore; KGE training types) are closed `Literal`
variants of a config union, dispatched through a closed kind of the one registry
mechanism (`plugins/registry.py`, `Kind(closed=True)`): a user extends them by writing a
strategy or task plugin, not through entry points. This test keeps each table and its
config union in step, so a variant added to one side only fails here instead of at run
time, and checks that each name's config class is the union's member of that name.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest

from shoal.plugins.registry import PluginRegistry
from shoal.strategies.federated.aggregation import AGGREGATIONS
from shoal.strategies.federated.config import (
    ClientSelectionConfig,
    FederatedAggregationConfig,
    PartitionConfig,
)
from shoal.strategies.federated.partition import PARTITIONS
from shoal.strategies.federated.selection import SELECTIONS
from shoal.strategies.population.config import ExploitConfig, ExploreConfig
from shoal.strategies.population.operators import EXPLOITS, EXPLORES
from shoal.tasks.kge.config import KGETrainingConfig
from shoal.tasks.kge.training_types import TRAINING_TYPES


def choices(union: Any) -> set[str]:
    """The discriminator values of an `Annotated[A | B, Field(discriminator=...)]` union."""
    members, field = typing.get_args(union)
    key = field.discriminator
    return {
        value
        for model in typing.get_args(members)
        for value in typing.get_args(model.model_fields[key].annotation)
    }


@pytest.mark.parametrize(
    ("table", "union"),
    [
        (AGGREGATIONS, FederatedAggregationConfig),
        (SELECTIONS, ClientSelectionConfig),
        (PARTITIONS, PartitionConfig),
        (EXPLOITS, ExploitConfig),
        (EXPLORES, ExploreConfig),
        (TRAINING_TYPES, KGETrainingConfig),
    ],
    ids=lambda item: getattr(getattr(item, "kind", None), "key", ""),
)
def test_a_table_implements_exactly_its_config_choices(table: PluginRegistry, union: Any) -> None:
    assert set(table.names()) == choices(union)
    assert len(choices(union)) >= 2
    members, field = typing.get_args(union)
    for model in typing.get_args(members):
        (name,) = typing.get_args(model.model_fields[field.discriminator].annotation)
        assert table.get(name).config_class() is model
        assert callable(table.load(name))
