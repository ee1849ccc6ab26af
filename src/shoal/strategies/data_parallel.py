"""`data_parallel`: model replicas, a disjoint data shard each, gradients summed every step."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.aggregators import AGGREGATORS
from shoal.comm.buckets import BucketedGradientSync
from shoal.config.root import ShoalConfig
from shoal.config.strategy import DataParallelStrategyConfig
from shoal.strategies.base import Strategy
from shoal.training.contracts import GradientSync


class DataParallelStrategy(Strategy):
    """Each rank trains on its slice of every global batch; gradients are summed in buckets.

    Equivalence: the task's loss is a sum over samples, the trainer divides it by
    the global batch size, and the buckets are summed over ranks, so the update
    equals one process training on the whole global batch (up to float rounding).
    """

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        assert isinstance(config.strategy, DataParallelStrategyConfig)
        return config.strategy.num_replicas

    workers_field: ClassVar[str | None] = "num_replicas"

    @property
    def config(self) -> DataParallelStrategyConfig:
        config = self.ctx.config.strategy
        assert isinstance(config, DataParallelStrategyConfig)
        return config

    def attach(self, model: nn.Module) -> GradientSync:
        with torch.no_grad():  # every replica starts from rank 0's parameters and buffers
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        aggregator = AGGREGATORS.get(self.config.aggregation.method)()
        sync = BucketedGradientSync(
            model, aggregator, self.config.bucket_cap_mb, self.config.broadcast_buffers
        )
        self.ctx.log.info(
            "data_parallel: %d ranks, %d gradient buckets, %.1f MiB per step, aggregation %s",
            self.ctx.world_size,
            len(sync.buckets),
            sync.bytes_per_step() / (1 << 20),
            self.config.aggregation.method,
        )
        return sync

    def describe(self) -> str:
        return f"data_parallel x{self.ctx.world_size} ({self.config.aggregation.method})"
