"""`data_parallel`: model replicas, a disjoint data shard each, gradients summed every step."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.buckets import BucketedGradientSync
from shoal.comm.config import GossipAggregationConfig
from shoal.comm.gossip import GossipSync
from shoal.comm.methods import build_aggregator
from shoal.comm.topology import neighbours
from shoal.errors import ShoalError
from shoal.protocols.task import Task
from shoal.runtime.collectives import gather_tensors
from shoal.runtime.context import WorkerContext
from shoal.shape.job import JobShape
from shoal.strategies.base import Strategy
from shoal.strategies.data_parallel.config import DataParallelStrategyConfig
from shoal.training.balance import BatchShares
from shoal.training.contracts import GradientSync
from shoal.training.steps import StepLoop


class DataParallelStrategy(Strategy[DataParallelStrategyConfig]):
    """Each rank trains on its slice of every global batch; gradients are summed in buckets.

    Equivalence: the task's loss is a sum over samples, the trainer divides it by
    the global batch size, and the buckets are summed over ranks, so the update
    equals one process training on the whole global batch (up to float rounding).
    That holds for every exact aggregation method; compression approximates the
    sum, and gossip replaces it by neighbourhood averaging of parameters.
    """

    config_class: ClassVar[type[DataParallelStrategyConfig]] = DataParallelStrategyConfig

    sync: GradientSync

    def __init__(self, ctx: WorkerContext, shape: JobShape | None = None) -> None:
        super().__init__(ctx, shape)
        config = self.config
        self.shares = (
            BatchShares(ctx, config.rebalance_every, config.min_share)
            if config.balance == "dynamic" and ctx.world_size > 1
            else None
        )

    def run(self, task: Task) -> dict[str, Any]:
        """The shared step loop, with dynamic shares of each global batch if asked for."""
        return self.drive(task, lambda run: StepLoop(run, self, self.shares))

    def attach(self, model: nn.Module) -> GradientSync:
        ctx, aggregation = self.ctx, self.config.aggregation
        with torch.no_grad():  # every replica starts from rank 0's parameters and buffers
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        exact_native = aggregation.method == "native" and aggregation.compression is None
        if not exact_native and ctx.device.type != "cpu":
            raise ShoalError(
                f"strategy.aggregation: {self.describe_aggregation()} runs on CPU workers (gloo) "
                'in this version; on CUDA use method = "native" (NCCL) without compression, '
                'or set run.device = "cpu"'
            )
        links = self.comm_group()
        if isinstance(aggregation, GossipAggregationConfig):
            adjacency = neighbours(aggregation.topology, ctx.world_size)
            self.sync = GossipSync(model, links, adjacency)
            ctx.log.info(
                "data_parallel: %d ranks, gossip over %s, neighbours of rank %d: %s",
                ctx.world_size,
                aggregation.topology,
                ctx.rank,
                adjacency[ctx.rank],
            )
            return self.sync
        sync = BucketedGradientSync(
            model,
            build_aggregator(aggregation, links),
            self.config.bucket_cap_mb,
            self.config.broadcast_buffers,
        )
        self.sync = sync
        ctx.log.info(
            "data_parallel: %d ranks, %d gradient buckets, %.1f MiB per step, aggregation %s",
            ctx.world_size,
            len(sync.buckets),
            sync.bytes_per_step() / (1 << 20),
            self.describe_aggregation(),
        )
        return sync

    def describe_aggregation(self) -> str:
        aggregation = self.config.aggregation
        compression = getattr(aggregation, "compression", None)
        return aggregation.method + (f" + {compression.kind}" if compression else "")

    def state_dict(self) -> dict[str, Any]:
        """Collective: every rank's own state (compression residuals, gossip replicas)."""
        ranks = gather_tensors(self.ctx, self.sync.rank_state_dict())
        state: dict[str, Any] = {"ranks": ranks} if self.ctx.is_main and any(ranks) else {}
        if self.shares is not None:
            state["balance"] = self.shares.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.shares is not None and "balance" in state:
            self.shares.load_state_dict(state["balance"])
        ranks = state.get("ranks") or []
        if not ranks:
            return
        if len(ranks) != self.ctx.world_size:
            self.ctx.log.warning(
                "the checkpoint holds per-rank aggregation state of %d workers, this job has %d: "
                "it starts afresh (compression residuals at zero, gossip replicas from rank 0)",
                len(ranks),
                self.ctx.world_size,
            )
            return
        self.sync.load_rank_state_dict(ranks[self.ctx.rank])

    def describe(self) -> str:
        balance = ", dynamic shares" if self.shares is not None else ""
        return f"data_parallel x{self.ctx.world_size} ({self.describe_aggregation()}{balance})"
