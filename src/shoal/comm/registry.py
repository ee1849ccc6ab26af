"""Aggregation methods and compressors by name, and building one from its config."""

from __future__ import annotations

from typing import Any

from shoal.comm.aggregators import Aggregator, BlockingAggregator, NativeAllReduce
from shoal.comm.compression.base import CompressedAggregator, Compressor
from shoal.comm.compression.cast import BFloat16Cast, Float16Cast
from shoal.comm.compression.powersgd import PowerSGDCompressor
from shoal.comm.compression.sparse import RandomKCompressor, TopKCompressor
from shoal.comm.hierarchical import HierarchicalAllReduce
from shoal.comm.links import CommGroup
from shoal.comm.parameter_server import ParameterServerAllReduce
from shoal.comm.ring import RingAllReduce
from shoal.comm.tree import TreeAllReduce
from shoal.registry import Registry

#: methods that sum buckets exactly (gossip, which averages parameters instead, is apart)
AGGREGATORS: Registry[type[BlockingAggregator]] = Registry("aggregation method")
for _method in (
    NativeAllReduce,
    RingAllReduce,
    TreeAllReduce,
    HierarchicalAllReduce,
    ParameterServerAllReduce,
):
    AGGREGATORS.add(_method.method, _method)

COMPRESSORS: Registry[type[Compressor]] = Registry("compression kind")
for _compressor in (
    TopKCompressor,
    RandomKCompressor,
    Float16Cast,
    BFloat16Cast,
    PowerSGDCompressor,
):
    COMPRESSORS.add(_compressor.kind, _compressor)


def build_aggregator(config: Any, links: CommGroup) -> Aggregator:
    """The aggregator a `[strategy.aggregation]` config describes, compression included."""
    method = AGGREGATORS.get(config.method).from_config(config, links)
    compression = getattr(config, "compression", None)
    if compression is None:
        return method
    return CompressedAggregator(COMPRESSORS.get(compression.kind).from_config(compression), method)
