"""tensor_parallel, fully_sharded and hybrid: one strategy class, three configs.

Each rank builds the full model from the seed, the layout (`layout.py`) shards
it over the mesh, and the step loop trains it: the global batch is split over
the data dimension only (ranks of one tensor group see the same samples), so
the update equals one process training on the whole batch (the loss is a sum
divided by the global batch size; the data dimension sums gradients).

Evaluation runs every window on every rank (a task view on a world of one):
the sharded forward is collective, so every rank of a tensor group or FSDP
group must run the same batches, and the figures need no reduction.
"""

from __future__ import annotations

import resource
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.protocols.task import Task
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.shape.job import JobShape
from shoal.strategies.base import Strategy
from shoal.strategies.spmd.config import (
    FullyShardedStrategyConfig,
    HybridStrategyConfig,
    SpmdSection,
    TensorParallelStrategyConfig,
)
from shoal.strategies.spmd.layout import build_mesh, lay_out
from shoal.strategies.spmd.pipeline_mesh import MeshPipelineStrategy
from shoal.strategies.spmd.sync import SpmdGradientSync, local
from shoal.training.contracts import GradientSync
from shoal.training.learner import Learner
from shoal.training.steps import StepLoop


class SpmdStrategy(Strategy[SpmdSection]):
    """The mesh from the config's dims, the model laid out on it, the step loop."""

    #: each of the three registered subclasses names its own (SpmdSection is abstract)
    config_class: ClassVar[type[SpmdSection]]

    sync: SpmdGradientSync
    learner: Learner

    def attach(self, model: nn.Module) -> GradientSync:
        ctx, config = self.ctx, self.config
        dims = config.dims()
        self.mesh = build_mesh(ctx.device, dims, self.roles.workers)
        coords = self.roles.coordinates(ctx.rank)
        where = ", ".join(f"{k} {v}" for k, v in coords.items())
        sharded = lay_out(
            self._task,
            config.type,  # type: ignore[attr-defined]
            model,
            self.mesh,
            dims,
            config.data_mode(),
            config.sequence_parallel,
            ctx.config.train.mixed_precision == "bf16",
            config.plan,
            config.wrap,
        )
        replicated = config.data_mode() == "replicated" and dims.get("data", 1) > 1
        self.sync = SpmdGradientSync(model, self.mesh, dims, replicated, where)
        self.model = model
        ctx.log.info(
            "%s: mesh %s, this rank at %s; data dimension %s; %.2f MiB of parameters here",
            config.type,  # type: ignore[attr-defined]
            " x ".join(f"{k} {v}" for k, v in dims.items()),
            where,
            "sharded (FSDP, per block)" if sharded else "replicated (per-block all-reduce)",
            _bytes(model.parameters()) / (1 << 20),
        )
        return self.sync

    def data_share(self) -> tuple[int, int]:
        """(index, count) of this rank's slice of each global batch: its data coordinate."""
        coords = self.roles.coordinates(self.ctx.rank)
        return coords.get("data", 0), self.config.dims().get("data", 1)

    def describe(self) -> str:
        dims = self.config.dims()
        mesh = " x ".join(f"{k} {v}" for k, v in dims.items())
        return f"{self.config.type} ({mesh})"  # type: ignore[attr-defined]

    def run(self, task: Task) -> dict[str, Any]:
        ctx = self.ctx
        solo = replace(ctx, rank=0, world_size=1, backend=None, heartbeat=None, group=None)
        view = task.on(solo)  # evaluation: every rank every window (see the module docstring)
        self._task = view
        return self.drive(view, lambda run: SpmdLoop(run, self))

    def make_learner(self, model: nn.Module, sync: GradientSync, total_steps: int) -> Learner:
        train = self.ctx.config.train
        index, count = self.data_share()
        self._task_size_check(count)
        learner = Learner(self._task, model, sync, train, total_steps, share=(index, count))
        # a tensor group's ranks train on the same samples: the first counts them
        learner.counted = self.roles.coordinates(self.ctx.rank).get("tensor", 0) == 0
        self.learner = learner
        return learner

    def _task_size_check(self, count: int) -> None:
        """Every rank of a sharded data dimension must run a forward pass in each
        micro-batch (FSDP's gathers are collective): no share may be empty."""
        train = self.ctx.config.train
        smallest = train.batch_size
        size = self._task.train_size
        if not train.drop_last and size % train.batch_size:
            smallest = size % train.batch_size
        need = count * train.micro_batches
        if self.config.data_mode() == "sharded" and count > 1 and smallest < need:
            raise ShoalError(
                f"train.batch_size: a step of {smallest} samples leaves some of the {count} data "
                f"ranks x {train.micro_batches} micro-batches without samples; use batch sizes "
                f"of at least {need} (and train.drop_last = true if the epoch's last batch is "
                "smaller)"
            )

    def memory(self) -> dict[str, Any]:
        """Collective: each rank's bytes of parameters, gradients and optimizer state (its
        local shards) and its peak resident memory."""
        learner = self.learner
        params = _bytes(learner.model.parameters())
        grads = _bytes(p.grad for p in learner.model.parameters() if p.grad is not None)
        optim = _bytes(
            value
            for state in learner.optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor)
        )
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        world, rank = self.ctx.world_size, self.ctx.rank
        rows = [0.0] * (4 * world)
        rows[4 * rank : 4 * rank + 4] = [params, grads, optim, peak]
        total = all_reduce_sum(self.ctx, rows)
        keys = ("parameters", "gradients", "optimizer", "peak_rss")
        ranks = [
            {f"{k}_bytes": int(total[4 * r + i]) for i, k in enumerate(keys)} for r in range(world)
        ]
        for entry in ranks:
            entry["state_bytes"] = (
                entry["parameters_bytes"] + entry["gradients_bytes"] + entry["optimizer_bytes"]
            )
        return {"memory": {"per_rank": ranks, "mesh": self.config.dims()}}


def _bytes(tensors: Any) -> int:
    total = 0
    for tensor in tensors:
        piece = local(tensor.detach())
        total += piece.numel() * piece.element_size()
    return total


class SpmdLoop(StepLoop):
    """The step loop with the learner on this rank's data slice, and each rank's memory in
    results.json."""

    strategy: SpmdStrategy

    def make_learner(self, model: nn.Module, sync: GradientSync) -> Learner:
        return self.strategy.make_learner(model, sync, self.total_steps)

    def section(self) -> dict[str, Any]:
        return {**super().section(), **self.strategy.memory()}


class TensorParallelStrategy(SpmdStrategy):
    config_class = TensorParallelStrategyConfig


class FullyShardedStrategy(SpmdStrategy):
    config_class = FullyShardedStrategyConfig


class HybridStrategy(SpmdStrategy):
    """A mesh of data and tensor dimensions is this class's; one with a pipeline dimension
    is the pipeline strategy's along it (`pipeline_mesh.py`)."""

    config_class = HybridStrategyConfig

    def __new__(cls, ctx: WorkerContext, shape: JobShape | None = None) -> Any:
        strategy = ctx.config.strategy
        if isinstance(strategy, HybridStrategyConfig) and "pipeline" in strategy.mesh:
            return MeshPipelineStrategy(ctx, shape)
        return super().__new__(cls)
