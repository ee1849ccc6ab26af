"""`[strategy] type = "data_parallel"`: replicas, buckets and the aggregation method."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.comm.config import AggregationConfig, NativeAggregationConfig
from shoal.config.base import LEARNERS, RESUME_SAFE, StrategySection, fill_default_tag


class DataParallelStrategyConfig(StrategySection):
    """Replicas of the model, one data shard each, gradients averaged every step."""

    type: Literal["data_parallel"] = "data_parallel"
    workers_field: ClassVar[str | None] = "num_replicas"
    #: the global batch is split over however many replicas there are: the same problem
    elastic: ClassVar[bool] = True
    #: a pipeline saves the whole model and one optimizer state in this layout too
    resumes_from: ClassVar[tuple[str, ...]] = (*LEARNERS, "pipeline")
    num_replicas: int = Field(
        2,
        ge=1,
        description="Worker processes `shoal train` starts on this machine (`--workers` "
        "overrides it; under torchrun the world size decides).",
        json_schema_extra=RESUME_SAFE,
    )
    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        description="Gradient bucket size in MiB: each bucket is reduced as soon as its "
        "gradients are ready, overlapping the rest of the backward pass.",
        json_schema_extra=RESUME_SAFE,
    )
    broadcast_buffers: bool = Field(
        True, description="Copy rank 0's buffers (e.g. batch-norm statistics) every step."
    )
    balance: Literal["static", "dynamic"] = Field(
        "static",
        description="How each global batch is split: static (even shares) or dynamic (each "
        "worker's share follows its measured speed, re-planned every `rebalance_every` steps; "
        "the update is the same under any split, so parameters still equal one process's).",
        json_schema_extra=RESUME_SAFE,
    )
    rebalance_every: int = Field(
        5,
        ge=1,
        description='balance = "dynamic": steps between two re-plans of the shares.',
        json_schema_extra=RESUME_SAFE,
    )
    min_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description='balance = "dynamic": the least share of a worker, as a fraction of the '
        "even share (no worker is starved of work, and its speed stays measured).",
        json_schema_extra=RESUME_SAFE,
    )
    aggregation: AggregationConfig = Field(
        default_factory=NativeAggregationConfig,
        description="How gradients are combined: method = native (the default) | ring | tree | "
        "hierarchical | parameter_server | gossip, with optional compression.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_method(cls, data: Any) -> Any:
        return fill_default_tag(data, "aggregation", "method", "native")

    def check(self, config: Any) -> None:
        """The shared loop's length rule, then the aggregation method's own rules."""
        super().check(config)
        self.aggregation.check(config)
