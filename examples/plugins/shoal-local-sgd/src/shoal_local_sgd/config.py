"""`[strategy] type = "local_sgd"`: how many replicas, how often they are averaged.

Imports pydantic and shoal's config base only, so `shoal config schema` and
config validation do not import torch to read it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from shoal.extend import StrategySection


class LocalSGDConfig(StrategySection):
    """Local SGD: replicas take k local steps on their own shards, then average their models."""

    #: the class shoal runs for this config (the entry point names this config class)
    implementation: ClassVar[str] = "shoal_local_sgd.strategy:LocalSGDStrategy"

    type: Literal["local_sgd"] = "local_sgd"
    #: the field `--workers` sets: one process a replica (the shape shoal lays out)
    workers_field: ClassVar[str | None] = "num_replicas"

    num_replicas: int = Field(
        2, ge=1, description="Worker processes, one replica each (`--workers` sets it)."
    )
    average_every: int = Field(
        4,
        ge=1,
        description="k: local optimizer steps between two model averagings (1: every step, "
        "which with plain SGD is data_parallel).",
    )
    average_buffers: bool = Field(
        True, description="Average floating-point buffers (batch-norm statistics) too."
    )
