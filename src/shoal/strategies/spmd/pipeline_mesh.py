"""`hybrid` with a pipeline dimension: the pipeline strategy over one axis of the mesh.

A mesh such as `{ data = 2, pipeline = 2 }` or `{ pipeline = 2, tensor = 2 }`
is the pipeline strategy run by each pipeline of the mesh (the ranks that
share every other coordinate), with the same partition, schedule, learner and
bubble figures (`strategies/pipeline/`), and three changes, each made by the
mechanism the other SPMD layouts use:

- a stage is built on the pipeline dimension's process group, its blocks laid
  out in place by `layout.lay_out` over the other dimensions (the
  Megatron plan over `tensor`, FSDP over a sharded `data`); under
  interleaved 1F1B a rank holds `virtual_stages` such stages (loop placement),
  each laid out on its own, joined by the full model's names for the
  optimizer, the gradient sync and DCP (`stages.join_stages`);
- the stage's gradients are synced by :class:`SpmdGradientSync` over the stage
  (a replicated data dimension: one all-reduce per block, summed, the loss
  being already divided by the global batch; a sharded one: FSDP's reduction);
- checkpoints go through DCP: each rank saves its stage's pieces by the full
  model's parameter names (`checkpoint/sharded.py`), so the checkpoint resumes
  at the same mesh exactly, and under local (or any layout) with the same
  parameters.

Each data replica of a pipeline trains on its slice of every global batch,
cut into the configured micro-batches. A rank holds only its stages, as a
pipeline rank does (`PipelineStrategy.build_model`: the model on the meta
device, values given to this rank's stages alone, or built whole and the rest
dropped), laid out in place; evaluation, the best model and the test splits run
through the laid-out stages along the pipeline dimension (`pipeline/record.py`),
every rank every batch (the sharded forwards are collective).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shoal.checkpoint.dcp_io import ShardedModelPart
from shoal.checkpoint.parts import StatePart
from shoal.runtime.context import WorkerContext
from shoal.shape.job import stage_indices
from shoal.shape.roles import RankRoles
from shoal.strategies.pipeline.learner import PipelineSync, StageLearner
from shoal.strategies.pipeline.record import StagedModel
from shoal.strategies.pipeline.stages import PipelinePlace, build_stages
from shoal.strategies.pipeline.strategy import PipelineStrategy
from shoal.strategies.spmd.config import HybridStrategyConfig
from shoal.strategies.spmd.layout import build_mesh, lay_out
from shoal.strategies.spmd.sync import SpmdGradientSync
from shoal.training.learner import Learner


class MeshPipelineSync(PipelineSync):
    """The pipeline's clock and bubble figures; the stage's gradients synced as the other
    SPMD layouts sync a model (`sync.py`), non-finite ones named with mesh coordinates."""

    def __init__(
        self,
        ctx: WorkerContext,
        named: list[tuple[str, nn.Parameter]],
        place: PipelinePlace,
        grads: SpmdGradientSync,
        roles: RankRoles,
    ) -> None:
        super().__init__(ctx, named, place)
        self.grads, self.roles = grads, roles

    def combine(self) -> list[str]:
        self.grads.loss_scale = self.loss_scale
        self.grads.finish()
        return self.grads.found

    def norm_share(self) -> torch.Tensor:
        """The stage's pieces no other rank of its data and tensor dimensions counts."""
        return self.grads.norm_share()

    def stages_of(self, rank: int) -> list[int]:
        """The stages at `rank`'s pipeline coordinate (loop placement, as in the pipeline)."""
        return stage_indices(self.roles.coordinates(rank)["pipeline"], self.ranks, self.local)


class MeshStageLearner(StageLearner):
    """A stage of a mesh: its parameters and optimizer state saved through DCP, by the
    full model's names (every rank its pieces, DTensors where laid out)."""

    def __init__(self, *args: Any, counted: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counted = counted  # the last stage's tensor ranks > 0 repeat its samples

    def _seat(self, place: PipelinePlace, sync: PipelineSync) -> None:
        super()._seat(place, sync)
        self.sharded = ShardedModelPart(self.model, self.optimizer)

    def parts(self) -> dict[str, StatePart]:
        return Learner.parts(self)


class MeshPipelineStrategy(PipelineStrategy):
    """The pipeline strategy along the mesh's pipeline dimension (see the module docstring).
    `HybridStrategy` hands a mesh with a pipeline dimension to it."""

    config: HybridStrategyConfig  # a hybrid mesh's section (a PipelineFields)

    learner_class = MeshStageLearner

    @property
    def coords(self) -> dict[str, int]:
        return self.roles.coordinates(self.ctx.rank)

    @property
    def pipeline_rank(self) -> int:
        return self.coords["pipeline"]

    def _along_pipeline(self) -> tuple[list[int], Any, int]:
        group = self.mesh["pipeline"].get_group()
        return dist.get_process_group_ranks(group), group, self.coords["pipeline"]

    def _staged_forward(self) -> StagedModel:
        """The forward through the pipeline's laid-out stages (FSDP and the tensor plan act
        in their calls; under the learner's precision, as they train)."""
        mine = dict(zip(self.place.indices, self.place.modules, strict=True))
        whole = self.learner.full
        return StagedModel(self.ctx, whole, mine, self.place.total, self._along_pipeline())

    def _place(self, model: nn.Module) -> PipelinePlace:
        ctx, config = self.ctx, self.config
        dims = config.dims()
        self.mesh = build_mesh(ctx.device, dims, self.roles.workers)
        self.inner = {k: v for k, v in dims.items() if k != "pipeline"}
        bf16 = ctx.config.train.mixed_precision == "bf16"

        def prepare(stage: nn.Module) -> nn.Module:
            lay_out(  # in place: the model holds this rank's stages, laid out, and no more
                self.task,
                "hybrid",
                stage,
                self.mesh,
                self.inner,
                config.data_mode(),
                False,
                bf16,
                config.plan,
                config.wrap,
            )
            return stage

        group = self.mesh["pipeline"].get_group()
        coords = self.coords
        return build_stages(
            self.cut(model),
            self.partition,
            group,
            coords["pipeline"],
            dims["pipeline"],
            ctx.device,
            prepare,
        )

    def _sync(self, model: nn.Module) -> PipelineSync:
        config, dims = self.config, self.inner
        stage = self.place.model  # this rank's stages, by the full model's names
        replicated = config.data_mode() == "replicated" and dims.get("data", 1) > 1
        where = ", ".join(f"{k} {v}" for k, v in self.coords.items())
        grads = SpmdGradientSync(stage, self.mesh, dims, replicated, where)
        named = list(stage.named_parameters())
        return MeshPipelineSync(self.ctx, named, self.place, grads, self.roles)

    def _learner_options(self) -> dict[str, Any]:
        coords = self.coords
        return {
            "share": (coords.get("data", 0), self.inner.get("data", 1)),
            "group": self.mesh["pipeline"].get_group(),
            "counted": coords.get("tensor", 0) == 0,
        }

    def section(self) -> dict[str, Any]:
        section = super().section()
        section["pipeline"]["mesh"] = self.config.dims()
        return section

    def describe(self) -> str:
        config = self.config
        mesh = " x ".join(f"{k} {v}" for k, v in config.dims().items())
        return f"hybrid ({mesh}; {config.schedule}, {config.microbatches} micro-batches)"
