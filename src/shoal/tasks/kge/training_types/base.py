"""The contract of a KGE training type (LibKGE's `train.type`): how training samples
become scores, and scores a loss.

A training type owns what a *sample* is (a triple, or a query for KvsAll), turns a
list of sample indices into a batch, and returns the loss of a batch as a sum over
its samples (the task contract's invariant, so N data-parallel workers reproduce
one process). Regularization is the same for every type: weighted, on the rows
each sample names (`sample_rows`), or unweighted, on both whole tables once per
step, which as a sum over samples is that penalty times each sample's share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from shoal.errors import ConfigError
from shoal.protocols.task import LossOutput
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.losses import build_kge_loss, penalty, table_penalty
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.triples import KGData


class TrainingType(ABC):
    """Samples, batches and the summed loss of one training type."""

    def __init__(self, config: KGETaskConfig, data: KGData, seed: int) -> None:
        self.config = config
        self.data = data
        self.num_entities = len(data.entities)
        self.num_relations = len(data.relations)
        self.seed = seed
        self.loss_fn = build_kge_loss(config.loss)  # task.loss: shoal's own or a plugin
        #: whether its steps may be compiled (`compiled_scoring.planned`; the task sets it;
        #: a type that compiles nothing ignores it)
        self.compiled = False

    @property
    @abstractmethod
    def train_size(self) -> int:
        """Training samples per epoch."""

    def set_epoch(self, epoch: int) -> None:  # noqa: B027 - optional hook
        """Called before each epoch (epoch-keyed draws)."""

    @abstractmethod
    def batch(self, indices: torch.Tensor, device: torch.device) -> dict[str, Any]:
        """The samples `indices`, on `device`."""

    @abstractmethod
    def scored_loss(
        self, model: KGEModel, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Per-sample losses (n,), and the entity and relation rows each sample uses
        (lists of (n, width) tensors, before dropout) for weighted regularization."""

    def rows_touched(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The unique entity and relation ids a batch reads (what a parameter-server worker
        pulls for it). A training type that reads every row has none to name: a strategy
        that pulls rows (the parameter server refuses such a config before it starts; a
        custom strategy may not) gets the config error that says which setting to change."""
        reason = getattr(self.config.training, "unserved", None) or (
            "it does not name the rows a batch reads; use negative_sampling"
        )
        raise ConfigError(
            f"task.training.type: training type {self.config.training.type!r} cannot be "
            f"trained by pulling rows: {reason}"
        )

    def loss(self, model: KGEModel, batch: dict[str, Any]) -> LossOutput:
        losses, entities, relations = self.scored_loss(model, batch)
        regularization = self.config.regularization
        per_sample = losses + penalty(regularization, model, entities, relations)
        total = per_sample.sum()
        if regularization is not None and not regularization.weighted:
            total = total + len(losses) * table_penalty(regularization, model)
        return LossOutput(total, len(losses))


def sample_relation_ids(model: KGEModel, relations: torch.Tensor) -> list[torch.Tensor]:
    """The relation rows a triple's regularization counts: r, and r^-1 with reciprocal
    relations (LibKGE penalises both, whichever side a batch scores)."""
    ids = [relations]
    if model.reciprocal:
        ids.append(model.relation_ids(relations, True))
    return ids
