"""A pipeline rank's learner: its stages under torch's schedule, the rest as every learner.

:class:`PipelineLearner` is the step's :class:`~shoal.training.learner.Learner`
with one hook replaced: the forward and backward of the step's micro-batches
is one `schedule.step` over this rank's stages. Clipping takes the global
norm across the stages from the sync: each rank's squared norm rides on the
non-finite agreement's all-reduce (`PipelineSync.agree`), no collective of its
own. Mixed precision, the non-finite halt, the optimizer, warm-up and decay
are the learner's own, unchanged.

Equivalence with `local`: every rank takes the whole global batch; each
micro-batch's loss is the task's loss sum divided by the global batch (times
fp16's loss scale), the schedule does not rescale gradients, so the gradient
of each parameter is the sum over micro-batches, exactly what `local`'s
backward of the whole batch gives (up to float rounding). Dropout draws differ
from `local`'s (each stage draws from its own rank's generator), so the
equivalence holds with dropout = 0; a resume at the same partition restores
every rank's generator and is bit-identical with dropout too.

A rank holds only its stages (the rest of the model is on the meta device, names
and shapes without storage). Checkpoints save each rank's pieces through DCP by the
full model's names (`StagePart`): a pipeline checkpoint resumes under any partition,
any schedule or `local` (which reads the pieces whole), and `shoal export` gathers
them; a plain checkpoint of the whole model (`local`'s) loads into the stages, each
rank its own tensors and their optimizer state.

Evaluation, the best model and the test splits run through the stages
(`record.py`). A re-partition moves the blocks that change owner with their
optimizer state (`PipelineStrategy._repartition`, `moving_state`, `repartition`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from shoal.checkpoint.dcp_io import ShardedModelPart
from shoal.checkpoint.marker import is_marker
from shoal.config.train import TrainConfig
from shoal.errors import ShoalError
from shoal.protocols.capabilities import PIPELINE_STAGES
from shoal.protocols.task import LossOutput, Task
from shoal.runtime.context import WorkerContext
from shoal.runtime.memory import peak_memory_bytes
from shoal.strategies.pipeline.measure import StageClock, gather_figures
from shoal.strategies.pipeline.record import load_stage
from shoal.strategies.pipeline.stages import (
    PipelinePlace,
    bubble_theory,
    stage_indices,
)
from shoal.training.contracts import AgreeingSync, unscaled_grads
from shoal.training.faults import straggle
from shoal.training.learner import Learner
from shoal.training.meter import StepStats
from shoal.training.nonfinite import GradientCheck
from shoal.training.optim import build_optimizer, build_scheduler

OPTIMIZER_KEY = "\t"  # between a parameter's name and its optimizer state's key


class PipelineSync(AgreeingSync):
    """The gradients of this rank's stages: nothing to combine (each parameter lives on one
    rank); non-finite ones are found locally and agreed on by every rank; the step's idle
    time (bubble and messages) is its communication time."""

    def __init__(
        self, ctx: WorkerContext, named: list[tuple[str, nn.Parameter]], place: PipelinePlace
    ) -> None:
        self.ctx, self.named, self.place = ctx, named, place
        self.clock = StageClock()
        self.ranks = place.total // len(place.indices)
        self.local = len(place.indices)
        self.found: list[str] = []
        self._check = GradientCheck([])  # the step's non-finite check, its norms kept
        self._step_started = (0.0, 0.0)  # the clock's (compute, step) before this step
        self.totals = {"compute_s": 0.0, "step_s": 0.0, "steps": 0.0}
        self.state_bytes = 0
        #: compute seconds and steps since the partition was last weighed (`rebalance.py`)
        self.work_s, self.work_steps = 0.0, 0

    def take_over(self, old: PipelineSync) -> None:
        """Go on with `old`'s clock and totals (the stages were rebuilt at a new partition)."""
        self.clock, self.totals = old.clock, old.totals
        self.work_s, self.work_steps = old.work_s, old.work_steps

    def take_work(self) -> tuple[float, int]:
        """Compute seconds and steps since the last call."""
        figures = (self.work_s, self.work_steps)
        self.work_s, self.work_steps = 0.0, 0
        return figures

    def zero_grad(self) -> None:
        for _, param in self.named:
            param.grad = None

    def begin_step(self) -> None:
        self._step_started = (self.clock.compute_s, self.clock.step_s)

    def finish(self) -> float:
        self.found = self.combine()
        compute = self.clock.compute_s - self._step_started[0]
        wall = self.clock.step_s - self._step_started[1]
        self.work_s += compute
        self.work_steps += 1
        return max(wall - compute, 0.0)

    def combine(self) -> list[str]:
        """Undo the loss scale; the names of non-finite gradients here. Nothing to combine
        across ranks: each parameter lives on one (a hybrid mesh's stage reduces its data
        dimension here)."""
        self._check = GradientCheck(unscaled_grads(self.named, self.loss_scale))
        return self._check.read()[0]

    def norm_share(self) -> torch.Tensor:
        """The squares of this rank's gradients (each parameter lives on one rank), from
        the norms the non-finite check took: one pass over them for both."""
        return self._check.square()

    @property
    def agree_device(self) -> torch.device:
        return self.ctx.device

    def stages_of(self, rank: int) -> list[int]:
        """The stages `rank` holds (the pipeline is the world)."""
        return stage_indices(rank, self.ranks, self.local)

    def interval_metrics(self) -> dict[str, float]:
        """Collective: the interval's bubble (mean over ranks) beside the schedule's theory,
        and each rank's compute and idle seconds per step and peak memory."""
        compute, step, steps = self.clock.take()
        for key, value in (("compute_s", compute), ("step_s", step), ("steps", steps)):
            self.totals[key] += value
        ranks = self.gather(compute, step, steps)
        metrics: dict[str, float] = {
            "pipeline_bubble": _mean_bubble(ranks),
            "pipeline_bubble_theory": self.theory,
        }
        for rank, figures in enumerate(ranks):
            per_step = max(figures["steps"], 1.0)
            metrics[f"rank{rank}_compute_s"] = figures["compute_s"] / per_step
            metrics[f"rank{rank}_idle_s"] = (figures["step_s"] - figures["compute_s"]) / per_step
            metrics[f"rank{rank}_peak_mb"] = figures["peak_mb"]
        return metrics

    @property
    def theory(self) -> float:
        schedule = self.ctx.config.strategy
        return bubble_theory(
            getattr(schedule, "schedule", "1f1b"),
            self.ranks,
            getattr(schedule, "microbatches", 1),
            self.local,
        )

    def gather(self, compute: float, step: float, steps: float) -> list[dict[str, float]]:
        figures = {
            "compute_s": compute,
            "step_s": step,
            "steps": float(steps),
            "peak_mb": peak_memory_bytes(self.ctx.device) / 2**20,
            "state_mb": self.state_bytes / 2**20,
        }
        return gather_figures(self.ctx, figures)

    def summary(self) -> dict[str, Any]:
        """Collective: the whole run's figures per rank, for results.json."""
        compute, step, steps = self.clock.take()
        for key, value in (("compute_s", compute), ("step_s", step), ("steps", steps)):
            self.totals[key] += value
        t = self.totals
        ranks = self.gather(t["compute_s"], t["step_s"], t["steps"])
        return {
            "bubble": {"measured": _mean_bubble(ranks), "theory": self.theory},
            "ranks": [
                {
                    "rank": rank,
                    "stages": self.stages_of(rank),
                    "compute_s": f["compute_s"],
                    "idle_s": f["step_s"] - f["compute_s"],
                    "bubble": _bubble(f),
                    "peak_mb": f["peak_mb"],
                    "parameters_gradients_optimizer_mb": f["state_mb"],
                }
                for rank, f in enumerate(ranks)
            ],
        }


def _bubble(figures: dict[str, float]) -> float:
    step = figures["step_s"]
    return (step - figures["compute_s"]) / step if step > 0 else 0.0


def _mean_bubble(ranks: list[dict[str, float]]) -> float:
    return sum(_bubble(f) for f in ranks) / len(ranks)


class StageLearner(Learner):
    """This rank's stages, their optimizer and schedule; see the module docstring."""

    def __init__(
        self,
        task: Task,
        full: nn.Module,
        place: PipelinePlace,
        sync: PipelineSync,
        train: TrainConfig,
        total_steps: int,
        make_schedule: Any,
        microbatches: int,
        norm_every: int = 0,
        share: tuple[int, int] = (0, 1),
        group: dist.ProcessGroup | None = None,
    ) -> None:
        # the stages by the full model's names (DCP saves by name; `PipelinePlace.model`)
        model = place.model
        super().__init__(task, model, sync, train, total_steps, share=share, norm_every=norm_every)
        self.full = full  # the model's names and structure; what this rank does not hold is on meta
        self.stages = PIPELINE_STAGES.of(task, "pipeline")  # batches in, the last stage's loss
        self.group = group  # the pipeline's ranks (None: the world)
        self.microbatches = microbatches
        self.ctx = sync.ctx
        self.make_schedule = make_schedule
        self.full_names = [n for n, _ in full.named_parameters()]
        self.version = 0  # optimizer steps taken here
        self._scale = 1.0
        self._outputs: list[LossOutput] = []
        self._seat(place, sync)

    def _seat(self, place: PipelinePlace, sync: PipelineSync) -> None:
        """Take `place`'s stages (their modules are `self.model`, the optimizer's) under a
        schedule, timed by `sync`'s clock, forward in the learner's precision; checkpoints
        of their pieces by the full model's names (DCP: every rank its own)."""
        self.place, self.psync = place, sync
        self.schedule = self.make_schedule(self._loss)
        for stage in place.stages:
            sync.clock.wrap(stage)
        for module in place.modules:  # forward in mixed precision, backward as autograd runs it
            module.forward = self._in_precision(module.forward)
        names = {id(p): n for n, p in self.full.named_parameters()}
        self.local_names = [names.get(id(p), n) for n, p in self.model.named_parameters()]
        sync.state_bytes = _state_bytes(self.model, self.optimizer)
        self.sharded = StagePart(self.model, self.optimizer, self._from_full)

    def repartition(self, place: PipelinePlace, sync: PipelineSync, moved: dict[str, Any]) -> None:
        """Move to `place` (stages of a new partition, on the full model's modules, the
        blocks that came here already given their values) with the optimizer state of
        the parameters kept and `moved`'s (by name: those that came here), and the
        schedule's state."""
        mine = self._state_by_name()
        mine.update(moved)
        scheduler = self.scheduler.state_dict()
        group = {k: v for k, v in self.optimizer.state_dict()["param_groups"][0].items()}
        model = place.model
        self.model, self.sync = model, sync
        self.optimizer = build_optimizer(model.parameters(), self.train.optimizer)
        self.scheduler = build_scheduler(self.optimizer, self.train, self.total_steps)
        self._seat(place, sync)
        position = {name: i for i, name in enumerate(self.full_names)}
        group["params"] = list(range(len(self.full_names)))
        full = {position[name]: value for name, value in mine.items() if name in position}
        self._load_optimizer({"state": full, "param_groups": [group]})
        self._load_scheduler(scheduler)

    def _state_by_name(self) -> dict[str, dict[str, torch.Tensor]]:
        """This rank's optimizer state, by the full model's parameter names."""
        local = self.optimizer.state_dict()
        if len(local["param_groups"]) != 1:
            raise ShoalError("strategy pipeline trains optimizers of one parameter group only")
        return {self.local_names[i]: dict(values) for i, values in local["state"].items()}

    def moving_state(self, names: set[str]) -> dict[str, torch.Tensor]:
        """The parameters named `names` and their optimizer state (tensors only), flat by
        `name OPTIMIZER_KEY key` (the parameter itself under the empty key)."""
        params = dict(self.model.named_parameters())
        state = self._state_by_name()
        flat: dict[str, torch.Tensor] = {}
        for name in sorted(names):
            flat[f"{name}{OPTIMIZER_KEY}"] = params[name].detach()
            for key, value in state.get(name, {}).items():
                if isinstance(value, torch.Tensor):
                    flat[f"{name}{OPTIMIZER_KEY}{key}"] = value
        return flat

    # ------------------------------------------------------------ the step's hooks
    def step(self, global_batch: torch.Tensor, global_step: int | None = None) -> StepStats:
        try:
            return super().step(global_batch, global_step)
        finally:
            self.version += 1

    def forward_backward(
        self, local: torch.Tensor, scale: float, loss_scale: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        inputs, targets = self.stages.pipeline_batch(self.task.train_batch(local))
        self._scale, self._outputs = scale * loss_scale, []
        args = (inputs,) if self.place.has_first else ()
        target = targets if self.place.has_last else None
        clock = self.psync.clock
        started = time.perf_counter()
        self.schedule.step(*args, target=target, return_outputs=False)
        clock.step_s += time.perf_counter() - started
        clock.steps += 1
        loss_sum = torch.zeros((), device=self.device)
        sums: dict[str, torch.Tensor] = {}
        # torch's schedule infers the gradients' shapes on its first step with one extra
        # call of the loss: the last `microbatches` calls are this step's
        for out in self._outputs[-self.microbatches :]:
            loss_sum += out.loss_sum.detach()
            for name, value in out.sums.items():
                sums[name] = sums.get(name, 0) + value.detach()
        return loss_sum, sums, len(local) if self.place.has_last else 0

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of one micro-batch, as the schedule backpropagates it."""
        started = time.perf_counter()
        with self.precision.autocast():
            out: LossOutput = self.stages.pipeline_loss(output, target)
        self._outputs.append(out)
        loss = out.loss_sum * self._scale
        straggle(started)  # `[faults.inject] kind = "slow"`: a slower machine
        self.psync.clock.compute_s += time.perf_counter() - started
        return loss

    def _in_precision(self, forward: Any) -> Any:
        """`forward` under the learner's autocast (as `local` runs its forward), leaving the
        schedule's backward outside it (as `local`'s backward is)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            with self.precision.autocast():
                return forward(*args, **kwargs)

        return run

    # ------------------------------------------------------------ checkpoint parts
    def _from_full(self, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's share of an optimizer state in `local`'s layout (the full model's
        parameter order), in its own optimizer's."""
        saved_groups = state["param_groups"]
        if len(saved_groups) != 1 or len(saved_groups[0]["params"]) != len(self.full_names):
            raise ShoalError(
                "the checkpoint's optimizer state is not of this model's "
                f"{len(self.full_names)} parameters in one group; resume it with the strategy "
                "that wrote it"
            )
        position = {name: i for i, name in enumerate(self.full_names)}
        mine = {
            index: state["state"][position[name]]
            for index, name in enumerate(self.local_names)
            if position[name] in state["state"]
        }
        group = {k: v for k, v in saved_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.local_names)))
        return {"state": mine, "param_groups": [group]}


class StagePart(ShardedModelPart):
    """`model` and `optimizer` of a pipeline rank: its stages' pieces through DCP, by the
    full model's names; a plain checkpoint (`local`'s layout, whole model) gives each rank
    its own tensors."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, from_full: Any) -> None:
        super().__init__(model, optimizer)
        self.from_full = from_full

    def load_from(self, state: Any, folder: Path) -> None:
        if is_marker(state):
            super().load_from(state, folder)
            return
        load_stage(self.model, state, folder)
        self.loaded_optimizer = None

    def load_optimizer(self, state: Any) -> None:
        if is_marker(state):
            super().load_optimizer(state)
            return
        self.optimizer.load_state_dict(self.from_full(state))


def _state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, their gradients (as many bytes) and the optimizer's state tensors; the
    optimizer's state counted as the kind allocates it at its first step."""
    params = sum(
        (p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
        for p in model.parameters()
    )
    group = optimizer.param_groups[0]
    slots = {"Adam": 2, "AdamW": 2, "Adagrad": 1}.get(type(optimizer).__name__)
    if slots is None:  # SGD: a momentum buffer if it has momentum
        slots = 1 if group.get("momentum") else 0
    return params * (2 + slots)
