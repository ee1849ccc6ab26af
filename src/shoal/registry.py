"""Name tables for choices inside one strategy or task, whose error lists the names that exist.

What users extend goes through the plugin registry (`shoal/plugins/`): strategies,
tasks, aggregation methods, compressors, KG models and losses. The tables here
serve closed choices within one plugin (federated aggregation, client selection
and partition; population exploit, explore and optimizer knobs; KGE training
types): each choice is a `Literal` variant of the plugin's config, and
`tests/config/test_dispatch_tables.py` keeps every table equal to its config
union. To add a variant, add both; to let users add their own, make it a plugin
kind instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from shoal.errors import ShoalError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> implementation table for one family of choices (exploit methods, ...)."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register `item` under `name` (at import of the module that implements it)."""
        if name in self._items:
            raise ValueError(f"{self.family} {name!r} is registered twice")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise ShoalError(f"unknown {self.family} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
