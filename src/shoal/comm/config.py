"""`[strategy.aggregation]` of `data_parallel`: how gradients are combined, and compressed.

A union discriminated by `method`; the exact methods accept a
`[strategy.aggregation.compression]` table, a union discriminated by `kind`.
Both unions are assembled from the plugin registries (`shoal.plugins.kinds`),
so an installed aggregator or compressor plugin is accepted here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from shoal.comm.topology import check_adjacency
from shoal.config.base import ConfigModel, FieldError
from shoal.plugins.kinds import AGGREGATORS, COMPRESSORS


class TopKCompressionConfig(ConfigModel):
    """Send the largest-magnitude entries of each bucket; keep the rest for the next step."""

    kind: Literal["topk"] = "topk"
    ratio: float = Field(
        0.01, gt=0, le=1, description="Fraction of each bucket's entries sent every step."
    )
    error_feedback: bool = Field(
        True, description="Carry what was not sent into the next step's gradient (recommended)."
    )
    momentum_correction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Deep Gradient Compression's momentum, applied before sparsification "
        "(0: off). Use it with optimizer sgd and momentum = 0.",
    )

    def check(self, config: Any) -> None:
        """Deep Gradient Compression applies momentum before sparsification: not a second time."""
        optimizer = config.train.optimizer
        if self.momentum_correction and not (optimizer.kind == "sgd" and optimizer.momentum == 0):
            raise FieldError(
                ("train",),
                "strategy.aggregation.compression.momentum_correction applies momentum before "
                'sparsification: use optimizer kind = "sgd" with momentum = 0',
            )

    @model_validator(mode="after")
    def _momentum_needs_feedback(self) -> TopKCompressionConfig:
        if self.momentum_correction and not self.error_feedback:
            raise ValueError(
                "momentum_correction accumulates what was not sent: it needs error_feedback = true"
            )
        return self


class RandomKCompressionConfig(ConfigModel):
    """Send entries at random indices shared by all ranks; keep the rest for the next step."""

    kind: Literal["randomk"] = "randomk"
    ratio: float = Field(
        0.01, gt=0, le=1, description="Fraction of each bucket's entries sent every step."
    )
    error_feedback: bool = Field(
        True, description="Carry what was not sent into the next step's gradient (recommended)."
    )
    seed: int = Field(0, ge=0, description="Seed of the shared index draws.")


class Float16CompressionConfig(ConfigModel):
    """Reduce buckets in IEEE half precision (float16): half the bytes."""

    kind: Literal["fp16"] = "fp16"


class BFloat16CompressionConfig(ConfigModel):
    """Reduce buckets in bfloat16 (float32's range, 8 significant bits): half the bytes."""

    kind: Literal["bf16"] = "bf16"


class PowerSGDCompressionConfig(ConfigModel):
    """Rank-r approximation of every gradient matrix by one warm-started power iteration."""

    kind: Literal["powersgd"] = "powersgd"
    rank: int = Field(2, ge=1, description="Rank of the approximation (r in PowerSGD).")
    error_feedback: bool = Field(
        True, description="Carry what the approximation missed into the next step (recommended)."
    )
    seed: int = Field(0, ge=0, description="Seed of the initial factors, shared by all ranks.")


# every compressor registered (shoal's own above, and plugins), discriminated by `kind`
if TYPE_CHECKING:
    CompressionConfig = Any
else:
    CompressionConfig = COMPRESSORS.config_union()

_COMPRESSION_HELP = (
    "Gradient compression, composable with this method: kind = topk | randomk | fp16 | bf16 | "
    "powersgd (default: none)."
)


class _ExactMethod(ConfigModel):
    """An exact aggregation method, which may carry a compressor with rules of its own."""

    def check(self, config: Any) -> None:
        compression = getattr(self, "compression", None)
        if compression is not None:
            compression.check(config)


class NativeAggregationConfig(_ExactMethod):
    """The backend's own all-reduce (gloo or NCCL)."""

    method: Literal["native"] = "native"
    compression: CompressionConfig | None = Field(None, description=_COMPRESSION_HELP)


class RingAggregationConfig(_ExactMethod):
    """Ring all-reduce: chunked reduce-scatter + all-gather, bandwidth-optimal."""

    method: Literal["ring"] = "ring"
    compression: CompressionConfig | None = Field(None, description=_COMPRESSION_HELP)


class TreeAggregationConfig(_ExactMethod):
    """Recursive doubling: log2(n) rounds, latency-optimal for small buckets."""

    method: Literal["tree"] = "tree"
    compression: CompressionConfig | None = Field(None, description=_COMPRESSION_HELP)


class HierarchicalAggregationConfig(_ExactMethod):
    """Reduce inside groups of ranks, all-reduce among group leaders, broadcast inside groups."""

    method: Literal["hierarchical"] = "hierarchical"
    branching_factor: int | None = Field(
        None,
        ge=1,
        description="Ranks per group, consecutive ranks (default: the ranks that share a "
        "host, so one group per machine under torchrun or Slurm).",
    )
    compression: CompressionConfig | None = Field(None, description=_COMPRESSION_HELP)


class ParameterServerAggregationConfig(_ExactMethod):
    """Ranks 0..num_servers-1 each own a slice of the gradient: push, sum, pull."""

    method: Literal["parameter_server"] = "parameter_server"
    num_servers: int = Field(
        1, ge=1, description="Ranks that serve a slice each (at most the number of workers)."
    )
    compression: CompressionConfig | None = Field(None, description=_COMPRESSION_HELP)


TOPOLOGIES = ("ring", "torus", "exponential")


class GossipAggregationConfig(ConfigModel):
    """Decentralized SGD: no global average; each rank averages parameters with its neighbours."""

    method: Literal["gossip"] = "gossip"
    topology: str | list[list[Annotated[int, Field(ge=0)]]] = Field(
        "ring",
        description="Who averages with whom: ring | torus | exponential, or an adjacency list "
        "(list i holds the neighbours of rank i), e.g. [[1, 2], [0, 2], [0, 1]].",
    )

    @field_validator("topology", mode="before")
    @classmethod
    def _name_or_list(cls, value: Any) -> Any:
        if not isinstance(value, str | list):
            raise ValueError(
                "must be ring, torus, exponential or an adjacency list such as "
                f"[[1, 2], [0, 2], [0, 1]], got {value!r}"
            )
        return value

    @field_validator("topology")
    @classmethod
    def _check_topology(cls, value: str | list[list[int]]) -> str | list[list[int]]:
        if isinstance(value, str):
            if value not in TOPOLOGIES:
                raise ValueError(
                    f"unknown topology {value!r}; choose ring, torus, exponential or an "
                    "adjacency list such as [[1, 2], [0, 2], [0, 1]]"
                )
            return value
        check_adjacency(value)
        return value


# every aggregation method registered (shoal's own above, and plugins), by `method`
if TYPE_CHECKING:
    AggregationConfig = Any
else:
    AggregationConfig = AGGREGATORS.config_union()
