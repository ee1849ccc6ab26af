"""The families users may extend, and shoal's own members of each.

Built-ins are written as strings: the config schema is assembled from these
registries, and naming a config class must not import its strategy (torch, the
loops). The order of each table is the order `shoal config schema` and the
"choose one of" errors show.
"""

from __future__ import annotations

from shoal.plugins.registry import Kind, PluginRegistry

_AGG = "shoal.config.aggregation"

STRATEGIES = PluginRegistry(
    Kind(
        "strategies",
        "strategy",
        "type",
        "shoal.strategies.base:Strategy",
        (
            (
                "local",
                "shoal.strategies.local.strategy:LocalStrategy",
                "shoal.strategies.local.config:LocalStrategyConfig",
            ),
            (
                "data_parallel",
                "shoal.strategies.data_parallel.strategy:DataParallelStrategy",
                "shoal.strategies.data_parallel.config:DataParallelStrategyConfig",
            ),
            (
                "federated",
                "shoal.strategies.federated.strategy:FederatedStrategy",
                "shoal.strategies.federated.config:FederatedStrategyConfig",
            ),
            (
                "population_based",
                "shoal.strategies.population.strategy:PopulationStrategy",
                "shoal.strategies.population.config:PopulationStrategyConfig",
            ),
            (
                "parameter_server",
                "shoal.strategies.parameter_server.strategy:ParameterServerStrategy",
                "shoal.strategies.parameter_server.config:ParameterServerStrategyConfig",
            ),
        ),
    )
)

TASKS = PluginRegistry(
    Kind(
        "tasks",
        "task",
        "type",
        "shoal.tasks.base:Task",
        (
            (
                "classification",
                "shoal.tasks.classification.task:ClassificationTask",
                "shoal.tasks.classification.config:ClassificationTaskConfig",
            ),
            (
                "kge",
                "shoal.tasks.kge.task:KGETask",
                "shoal.tasks.kge.config:KGETaskConfig",
            ),
            ("lm", "shoal.tasks.lm.task:LMTask", "shoal.tasks.lm.config:LMTaskConfig"),
        ),
    )
)

AGGREGATORS = PluginRegistry(
    Kind(
        "aggregators",
        "aggregation method",
        "method",
        None,  # exact methods are BlockingAggregators; gossip is a GradientSync of its own
        (
            ("native", "shoal.comm.aggregators:NativeAllReduce", f"{_AGG}:NativeAggregationConfig"),
            ("ring", "shoal.comm.ring:RingAllReduce", f"{_AGG}:RingAggregationConfig"),
            ("tree", "shoal.comm.tree:TreeAllReduce", f"{_AGG}:TreeAggregationConfig"),
            (
                "hierarchical",
                "shoal.comm.hierarchical:HierarchicalAllReduce",
                f"{_AGG}:HierarchicalAggregationConfig",
            ),
            (
                "parameter_server",
                "shoal.comm.server_allreduce:ParameterServerAllReduce",
                f"{_AGG}:ParameterServerAggregationConfig",
            ),
            ("gossip", "shoal.comm.gossip:GossipSync", f"{_AGG}:GossipAggregationConfig"),
        ),
    )
)

COMPRESSORS = PluginRegistry(
    Kind(
        "compressors",
        "compression kind",
        "kind",
        "shoal.comm.compression.base:Compressor",
        (
            (
                "topk",
                "shoal.comm.compression.sparse:TopKCompressor",
                f"{_AGG}:TopKCompressionConfig",
            ),
            (
                "randomk",
                "shoal.comm.compression.sparse:RandomKCompressor",
                f"{_AGG}:RandomKCompressionConfig",
            ),
            ("fp16", "shoal.comm.compression.cast:Float16Cast", f"{_AGG}:Float16CompressionConfig"),
            (
                "bf16",
                "shoal.comm.compression.cast:BFloat16Cast",
                f"{_AGG}:BFloat16CompressionConfig",
            ),
            (
                "powersgd",
                "shoal.comm.compression.powersgd:PowerSGDCompressor",
                f"{_AGG}:PowerSGDCompressionConfig",
            ),
        ),
    )
)

KINDS: tuple[PluginRegistry, ...] = (STRATEGIES, TASKS, AGGREGATORS, COMPRESSORS)
"""Every registry, in the order `shoal plugins` lists them."""
