"""Strategies by name (the `type` of `[strategy]`)."""

from __future__ import annotations

from shoal.registry import Registry
from shoal.strategies.base import Strategy

STRATEGIES: Registry[type[Strategy]] = Registry("strategy")


def strategy_class(name: str) -> type[Strategy]:
    # Importing the built-in strategies registers them.
    import shoal.strategies.data_parallel
    import shoal.strategies.local  # noqa: F401

    return STRATEGIES.get(name)
