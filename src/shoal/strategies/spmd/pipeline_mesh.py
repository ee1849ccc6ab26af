"""`hybrid` with a pipeline dimension: the pipeline strategy over one axis of the mesh.

A mesh such as `{ data = 2, pipeline = 2 }` or `{ pipeline = 2, tensor = 2 }`
is the pipeline strategy run by each pipeline of the mesh (the ranks that
share every other coordinate), with the same partition, schedule, learner and
bubble figures (`strategies/pipeline/`), and three changes, each made by the
mechanism the other SPMD layouts use:

- a stage is built on the pipeline dimension's process group, from a copy of
  its blocks laid out by `layout.lay_out` over the other dimensions (the
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
cut into the configured micro-batches. Evaluation and the model of record use
the full model, brought up to date from the stages (whole tensors, from the
ranks at data and tensor coordinate 0) when it is needed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from shoal.checkpoint.dcp_io import ShardedModelPart
from shoal.checkpoint.parts import StatePart
from shoal.protocols.task import Task
from shoal.runtime.collectives import share_tensors
from shoal.runtime.context import WorkerContext
from shoal.shape.job import stage_indices
from shoal.shape.roles import RankRoles
from shoal.strategies.pipeline.learner import PipelineSync, StageLearner
from shoal.strategies.pipeline.stages import PipelinePlace, build_stages
from shoal.strategies.pipeline.strategy import PipelineStrategy
from shoal.strategies.spmd.config import HybridStrategyConfig
from shoal.strategies.spmd.layout import build_mesh, lay_out
from shoal.strategies.spmd.sync import SpmdGradientSync
from shoal.training.learner import Learner
from shoal.training.loop import ModelOfRecord
from shoal.training.steps import LocalModel


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
    full model's names (every rank its pieces), and the full model gathered from whole
    tensors."""

    def __init__(self, *args: Any, gives: bool, counted: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counted = counted  # the last stage's tensor ranks > 0 repeat its samples
        # even unsharded (data x pipeline, replicated), no rank holds the whole model
        self.sharded = ShardedModelPart(self.model, self.optimizer)
        self.gives = gives  # this rank sends its stage when the full model is gathered
        self._fresh_at = -1  # the full model is the seed's until first gathered

    def parts(self) -> dict[str, StatePart]:
        return Learner.parts(self)

    def refresh(self) -> None:
        """Collective: the full model from every stage's whole tensors."""
        if self._fresh_at == self.version:
            return
        whole = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        mine = {k: v for k, v in whole.items() if isinstance(v, torch.Tensor)} if self.gives else {}
        self.full.load_state_dict(share_tensors(self.ctx, mine, keep_all=True))
        self._fresh_at = self.version


class MeshRecord(LocalModel):
    """The model of record of a mesh: the full model every rank keeps, brought up to date
    from the stages before anyone sees it."""

    def __init__(self, ctx: WorkerContext, learner: MeshStageLearner) -> None:
        super().__init__(ctx, learner.full)
        self.learner = learner

    @property
    def model(self) -> nn.Module:
        self.learner.refresh()
        return self._model

    def validated(self, best: bool) -> None:
        self.learner.refresh()
        super().validated(best)


class MeshPipelineStrategy(PipelineStrategy):
    """The pipeline strategy along the mesh's pipeline dimension (see the module docstring).
    `HybridStrategy` hands a mesh with a pipeline dimension to it."""

    config: HybridStrategyConfig  # a hybrid mesh's section (a PipelineFields)

    learner_class = MeshStageLearner

    @property
    def coords(self) -> dict[str, int]:
        return self.roles.coordinates(self.ctx.rank)

    # a mesh's ranks keep the whole model beside their stages (evaluated on each rank's
    # share of the windows, the best model and its files), as the pipeline once did
    def evaluating(self, task: Task) -> Task:
        return task

    def build_model(self, whole: Callable[[], nn.Module]) -> nn.Module:
        return whole()

    def make_record(self) -> ModelOfRecord:
        assert isinstance(self.learner, MeshStageLearner)
        return MeshRecord(self.ctx, self.learner)

    def _place(self, model: nn.Module) -> PipelinePlace:
        ctx, config = self.ctx, self.config
        dims = config.dims()
        self.mesh = build_mesh(ctx.device, dims, self.roles.workers)
        self.inner = {k: v for k, v in dims.items() if k != "pipeline"}
        bf16 = ctx.config.train.mixed_precision == "bf16"

        def prepare(stage: nn.Module) -> nn.Module:
            mine = copy.deepcopy(stage)  # the full model stays whole, for evaluation
            lay_out(
                self.task,
                "hybrid",
                mine,
                self.mesh,
                self.inner,
                config.data_mode(),
                False,
                bf16,
                config.plan,
                config.wrap,
            )
            return mine

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
            "gives": coords.get("data", 0) == 0 and coords.get("tensor", 0) == 0,
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
