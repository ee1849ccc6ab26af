"""The contract between a workload and the training machinery.

A task owns its data, builds its model, turns a list of sample indices into a
batch, computes the loss as a *sum* over the batch's samples, and evaluates.
Everything distributed (sharding, gradient averaging, checkpoints) lives outside
it, so every strategy can train every task. What only some strategies need (a
model cut into stages, rows a parameter server holds, class labels) a task offers
as a capability (`protocols/capabilities.py`).

Why a sum: with a global batch of B samples split unevenly over N workers, the
gradient of the global mean loss is sum_over_workers(grad(loss_sum_r)) / B. The
trainer divides by B and the strategy sums over workers, so N workers reproduce
one worker exactly, whatever B mod N is.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from pydantic import BaseModel
from torch import nn

from shoal.config.base import task_section
from shoal.runtime.context import WorkerContext


@dataclass
class LossOutput:
    """The loss of one (micro-)batch.

    `loss_sum` is the sum of per-sample losses (with the graph attached); `count`
    the samples it covers; `sums` further additive statistics, such as the number
    of correct predictions, reported as `train_<name>` = sum / samples.
    """

    loss_sum: torch.Tensor
    count: int
    sums: dict[str, torch.Tensor] = field(default_factory=dict)


class Task(ABC):
    """A workload: model, data, loss and evaluation.

    A task is a plugin (`shoal.plugins`): shoal's own, a `shoal.tasks` entry point,
    or `[task] type = "custom"` with a dotted `class`. `config_class` is the
    pydantic model of its `[task]` table (of `[task.config]` under `type = "custom"`).
    """

    #: the pydantic model of this task's config section
    config_class: ClassVar[type[BaseModel]]

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    @property
    def section(self) -> Any:
        """This task's validated config section (`[task]`, or its `config` table for a class
        named by dotted path)."""
        return task_section(self.ctx.config)

    @property
    def primary_metric(self) -> tuple[str, str]:
        """The metric that picks the best model and stops early, and its direction: its
        config section's (`TaskSection.primary_metric`)."""
        metric: tuple[str, str] = getattr(self.section, "primary_metric", ("loss", "min"))
        return metric

    @property
    def tunable(self) -> dict[str, tuple[float, float]]:
        """The parameters population-based training may tune: its config section's."""
        tunable: dict[str, tuple[float, float]] = getattr(self.section, "tunable", {})
        return tunable

    def on(self, ctx: WorkerContext) -> Self:
        """This task (its data and caches shared, nothing copied) with its collectives run
        among the ranks of `ctx`: a strategy that evaluates within a group of its own (the
        parameter server's workers) or on one worker alone (a population's members) hands
        its loop such a view instead of changing the context of the task everyone shares."""
        view = copy.copy(self)
        view.ctx = ctx
        return view

    @property
    @abstractmethod
    def train_size(self) -> int:
        """Number of training samples; indices passed to `train_batch` lie in [0, train_size)."""

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialized model (the caller seeds the generators first)."""

    @property
    def batch_unit(self) -> int:
        """Consecutive samples of a batch that belong together (a chunk of KGE positives
        sharing its negatives): a batch is split among ranks and micro-batches in whole
        units, counted from its start, so any split trains what one process does."""
        return 1

    @abstractmethod
    def train_batch(self, indices: torch.Tensor) -> Any:
        """The training samples at `indices`, on the worker's device."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> LossOutput:
        """The summed loss of `batch` under `model`."""

    @abstractmethod
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Metrics on a held-out split. Collective: every rank calls it and gets the same result."""

    def set_tunable(self, model: nn.Module, name: str, value: float) -> None:
        """Give `model`, mid-training, a new value of the `tunable` parameter `name`."""
        raise KeyError(f"task {type(self).__name__} has no tunable parameter {name!r}")

    def eval_splits(self) -> list[str]:
        """The held-out splits evaluated during training."""
        return ["valid"]

    def test_splits(self) -> list[str]:
        """Splits evaluated once after training, with the best model (by `primary_metric`)."""
        return []

    def set_epoch(self, epoch: int) -> None:  # noqa: B027 - optional hook
        """Called before each epoch's first batch (and on resume): epoch-keyed sampling."""

    def checkpoint_files(self, folder: Path) -> dict[str, str]:
        """Rank 0, while a checkpoint folder is assembled: write files the task needs beside the
        model to use it again (a tokenizer) into `folder`; returns {file name: sha256}."""
        return {}

    def save_artifacts(self, model: nn.Module) -> None:  # noqa: B027 - optional hook
        """Collective, after training: write what the task leaves in the run directory."""

    def summary(self) -> dict[str, Any]:
        """Facts about the data worth keeping in results.json (sizes, skipped samples)."""
        return {}


def move_to(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(move_to(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: move_to(value, device) for key, value in batch.items()}
    return batch


def rank_slice(total: int, rank: int, world_size: int) -> slice:
    """The contiguous part of `total` items owned by `rank`: sizes differ by at most one."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))
