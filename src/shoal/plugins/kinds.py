"""The families users may extend, and shoal's own members of each.

Built-ins are written as strings: the config schema is assembled from these
registries, and naming a config class must not import its strategy (torch, the
loops). The order of each table is the order `shoal config schema` and the
"choose one of" errors show.
"""

from __future__ import annotations

from shoal.plugins.registry import Kind, PluginRegistry

_AGG = "shoal.comm.config"

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
            (
                "pipeline",
                "shoal.strategies.pipeline.strategy:PipelineStrategy",
                "shoal.strategies.pipeline.config:PipelineStrategyConfig",
            ),
            (
                "tensor_parallel",
                "shoal.strategies.spmd.strategy:TensorParallelStrategy",
                "shoal.strategies.spmd.config:TensorParallelStrategyConfig",
            ),
            (
                "fully_sharded",
                "shoal.strategies.spmd.strategy:FullyShardedStrategy",
                "shoal.strategies.spmd.config:FullyShardedStrategyConfig",
            ),
            (
                "hybrid",
                "shoal.strategies.spmd.strategy:HybridStrategy",
                "shoal.strategies.spmd.config:HybridStrategyConfig",
            ),
        ),
    )
)

TASKS = PluginRegistry(
    Kind(
        "tasks",
        "task",
        "type",
        "shoal.protocols.task:Task",
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
            (
                "module",
                "shoal.tasks.module.task:ModuleTask",
                "shoal.tasks.module.config:ModuleTaskConfig",
            ),
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

_KGE = "shoal.tasks.kge"

KGE_MODELS = PluginRegistry(
    Kind(
        "kge_models",
        "kge model",
        "type",
        f"{_KGE}.models:KGEModel",
        (
            ("transe", f"{_KGE}.models:TransE", f"{_KGE}.model_config:TransEConfig"),
            ("distmult", f"{_KGE}.models:DistMult", f"{_KGE}.model_config:DistMultConfig"),
            ("complex", f"{_KGE}.models:ComplEx", f"{_KGE}.model_config:ComplExConfig"),
            ("rotate", f"{_KGE}.models:RotatE", f"{_KGE}.model_config:RotatEConfig"),
        ),
        config_base=f"{_KGE}.model_config:ModelOptions",
    )
)

KGE_LOSSES = PluginRegistry(
    Kind(
        "kge_losses",
        "kge loss",
        "kind",
        f"{_KGE}.losses:KGELoss",
        (
            (
                "margin_ranking",
                f"{_KGE}.losses:MarginRankingLoss",
                f"{_KGE}.loss_config:MarginRankingLossConfig",
            ),
            ("logistic", f"{_KGE}.losses:LogisticLoss", f"{_KGE}.loss_config:LogisticLossConfig"),
            ("softmax", f"{_KGE}.losses:SoftmaxLoss", f"{_KGE}.loss_config:SoftmaxLossConfig"),
            ("bce", f"{_KGE}.losses:BCELoss", f"{_KGE}.loss_config:BCELossConfig"),
        ),
        config_base=f"{_KGE}.loss_config:LossOptions",
    )
)

KINDS: tuple[PluginRegistry, ...] = (
    STRATEGIES,
    TASKS,
    AGGREGATORS,
    COMPRESSORS,
    KGE_MODELS,
    KGE_LOSSES,
)
"""Every registry, in the order `shoal plugins` lists them."""
