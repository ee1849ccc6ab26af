"""The aggregation methods that sum exactly, and building one from its
`[strategy.aggregation]` config, compression included.

The methods and compressors are plugins (`shoal.plugins.kinds`): shoal's own and
any installed under the `shoal.aggregators` / `shoal.compressors` entry points.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shoal.comm.aggregators import Aggregator, BlockingAggregator
from shoal.comm.compression.base import CompressedAggregator
from shoal.comm.links import CommGroup
from shoal.plugins.kinds import AGGREGATORS as _METHODS
from shoal.plugins.kinds import COMPRESSORS
from shoal.plugins.registry import PluginRegistry


class _ExactMethods:
    """The aggregation methods that sum buckets exactly (gossip averages parameters: apart)."""

    def __init__(self, methods: PluginRegistry) -> None:
        self.methods = methods

    def names(self) -> list[str]:
        return [n for n in self.methods if issubclass(self.methods.load(n), BlockingAggregator)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> type[BlockingAggregator]:
        cls: type[BlockingAggregator] = self.methods.load(name)
        return cls


AGGREGATORS = _ExactMethods(_METHODS)

__all__ = ["AGGREGATORS", "COMPRESSORS", "build_aggregator"]


def build_aggregator(config: Any, links: CommGroup) -> Aggregator:
    """The aggregator a `[strategy.aggregation]` config describes, compression included."""
    method = AGGREGATORS.get(config.method).from_config(config, links)
    compression = getattr(config, "compression", None)
    if compression is None:
        return method
    compressor = COMPRESSORS.load(compression.kind).from_config(compression)
    return CompressedAggregator(compressor, method)
