"""Every closed config choice has exactly one implementation, and every implementation a choice.

Seven choices inside a strategy or task (federated aggregation, client selection and
partition; population exploit and explore; KGE training types) are closed `Literal`
variants of a config union, dispatched through a name table (`shoal/registry.py`).
They are deliberately not plugin kinds: a user extends them by writing a strategy or
task plugin. This test keeps each table and its config union in step, so a variant
added to one side only fails here instead of at run time.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest

from shoal.registry import Registry
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
    ids=lambda item: getattr(item, "family", ""),
)
def test_a_table_implements_exactly_its_config_choices(table: Registry[Any], union: Any) -> None:
    assert set(table.names()) == choices(union)
    assert len(choices(union)) >= 2
