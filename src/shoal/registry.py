"""Registries by name, whose error lists the names that exist."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from shoal.errors import ShoalError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> implementation table for one family (strategies, tasks, aggregators...)."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register `item` under `name` (built-ins at import; users' own at run time)."""
        if name in self._items:
            raise ValueError(f"{self.family} {name!r} is registered twice")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """The decorator form of `add`."""

        def decorate(item: T) -> T:
            return self.add(name, item)

        return decorate

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
