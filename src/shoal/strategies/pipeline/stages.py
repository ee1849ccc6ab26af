"""Stages and schedules of one pipeline dimension, over a process group given to them.

Everything here takes the pipeline's process group and this rank's place in it,
never the world: the pipeline strategy passes the world, a hybrid mesh passes
its pipeline dimension's group. The runtime is torch's
(`torch.distributed.pipelining`): shoal only says which blocks each stage holds
and which schedule runs them.

Placement is torch's loop placement: with `ranks` ranks and `local` stages per
rank, rank r holds stages r, r + ranks, r + 2 ranks, ... (the layout
ScheduleInterleaved1F1B expects; with one stage per rank, stage r on rank r).

Gradients are not scaled by the schedule (`scale_grads=False`): the loss each
micro-batch returns is already its sum divided by the global batch, so the
micro-batches' gradients add up to the whole batch's, as under `local`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from shoal.shape.job import stage_indices
from shoal.strategies.pipeline.partition import Partition


@dataclass
class PipelinePlace:
    """This rank's part of one pipeline: its stages, their modules and torch's stage objects."""

    indices: list[int]  # stage indices held here, ascending
    modules: list[nn.Module]  # the stage models (sharing the full model's modules)
    stages: list[PipelineStage]
    total: int  # stages in the pipeline

    @functools.cached_property
    def model(self) -> nn.Module:
        """This rank's stages as one module named as the full model (`join_stages`): what
        the optimizer, the gradient sync and checkpoints see."""
        return self.modules[0] if len(self.modules) == 1 else join_stages(self.modules)

    @property
    def has_first(self) -> bool:
        return self.indices[0] == 0

    @property
    def has_last(self) -> bool:
        return self.indices[-1] == self.total - 1


def join_stages(modules: list[nn.Module]) -> nn.Module:
    """One module holding several stages' children under the full model's names (the
    stages of a rank under interleaved 1F1B: e.g. `embed` and `blocks.0` of stage 0,
    `blocks.2` of stage 2). Children that are module dicts (the blocks) are merged; any
    other child name may come from one stage only. It is never called: torch's schedule
    runs the stages themselves; it names their parameters for the optimizer, the
    gradient sync and DCP (a hybrid mesh's stages are copies, not the full model's)."""
    joined = nn.Module()
    for module in modules:
        if next(module.parameters(recurse=False), None) is not None:
            raise ValueError("a stage's parameters must sit in its children to be joined")
        _merge(joined, module)
    return joined


def _is_container(module: nn.Module) -> bool:
    """A module that only holds others by name (a dict of blocks, a path's parent)."""
    holds = type(module) in (nn.Module, nn.ModuleDict)
    return holds and next(module.parameters(recurse=False), None) is None


def _merge(into: nn.Module, module: nn.Module) -> None:
    """`module`'s children into `into`, containers merged by name at every depth."""
    for name, child in module.named_children():
        held = into._modules.get(name)
        if held is None and _is_container(child):
            held = nn.ModuleDict() if isinstance(child, nn.ModuleDict) else nn.Module()
            into.add_module(name, held)
            _merge(held, child)
        elif held is None:
            into.add_module(name, child)
        elif _is_container(held) and _is_container(child):
            _merge(held, child)
        else:
            raise ValueError(f"two stages of one rank both hold {name!r}")


def build_stages(
    cut: Callable[[int, int], nn.Module],
    partition: Partition,
    group: dist.ProcessGroup | None,
    group_rank: int,
    ranks: int,
    device: torch.device,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
) -> PipelinePlace:
    """This rank's stages, each `cut(first, last)` of the model (the task's
    `pipeline_stage`, sharing the full model's modules).

    `prepare` lays each stage module out before torch's stage wraps it (a hybrid mesh
    shards it over its tensor and data dimensions); without it the stages share the
    full model's modules."""
    total = len(partition)
    if total % ranks:
        raise ValueError(f"{total} stages do not spread evenly over {ranks} ranks")
    indices = stage_indices(group_rank, ranks, total // ranks)
    modules = [cut(*partition[i]) for i in indices]
    if prepare is not None:
        modules = [prepare(module) for module in modules]
    stages = [
        PipelineStage(module, index, total, device, group=group)
        for module, index in zip(modules, indices, strict=True)
    ]
    return PipelinePlace(indices, modules, stages, total)


def build_schedule(
    kind: str,
    place: PipelinePlace,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Any:
    """torch's schedule `kind` ("gpipe" | "1f1b" | "interleaved_1f1b") over this rank's stages."""
    if kind == "interleaved_1f1b":
        stages: list[Any] = list(place.stages)
        return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
    if len(place.stages) != 1:
        raise ValueError(f"schedule {kind} runs one stage per rank, this rank has {place.indices}")
    single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind]
    return single(place.stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)


def bubble_theory(kind: str, ranks: int, microbatches: int, local: int = 1) -> float:
    """The idle share of a step the schedule cannot avoid, with equal stages and free
    communication: (p - 1) / (m + p - 1) for GPipe and 1F1B (Huang et al., 2019;
    Narayanan et al., 2021); interleaving v stages per rank divides the fill and drain by
    v: (p - 1) / (v m + p - 1)."""
    v = local if kind == "interleaved_1f1b" else 1
    return (ranks - 1) / (v * microbatches + ranks - 1)
