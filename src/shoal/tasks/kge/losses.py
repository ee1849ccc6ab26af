"""Losses over scores, and penalties on embedding entries.

Each loss is per training sample (a positive triple, or a query for KvsAll) and
the task sums it over the batch (the trainer divides by the global batch size).

Against sampled negatives (`sampled_loss`), the K negatives of a positive enter
through weights w_k that sum to 1: uniform (1/K), or self-adversarial,
w = softmax(alpha * negative scores) with no gradient through w (Sun et al.,
2019), which spends the loss on the negatives the model finds most plausible.
`softmax` and `bce` follow LibKGE's `kl` and `bce` (a sum over the candidates).

Against every entity (`all_entities_loss`, 1vsAll and KvsAll), a query's scores
(one per entity) meet its labels: the index of the true entity (1vsAll) or a
row of (possibly smoothed) 0/1 labels (KvsAll).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from shoal.errors import ConfigError
from shoal.plugins.kinds import KGE_LOSSES
from shoal.tasks.kge.config import (
    BCELossConfig,
    KGELossConfig,
    LogisticLossConfig,
    LossOptions,
    MarginRankingLossConfig,
    RegularizationConfig,
    SoftmaxLossConfig,
)
from shoal.tasks.kge.models import KGEModel


def negative_weights(negatives: torch.Tensor, temperature: float | None) -> torch.Tensor:
    """(n, K) weights summing to 1 per row: uniform, or self-adversarial (detached softmax)."""
    if temperature is None:
        return torch.full_like(negatives, 1.0 / negatives.shape[-1])
    return torch.softmax(temperature * negatives.detach(), dim=-1)


class KGELoss(ABC):
    """A loss over scores (higher = more plausible), built from its `task.loss` config.

    The base of every KG loss, plugins' too (entry-point group `shoal.kge_losses`, whose
    entry point names the config class; the config's `implementation` names this class).
    `sampled` serves training type negative_sampling; `all_entities` serves 1vsAll and
    KvsAll, and only losses whose config says `every_entity = True` implement it.
    """

    config_class: ClassVar[type[LossOptions]] = LossOptions

    #: whether training may compile `sampled` with the model's scoring (`compiled_scoring.py`):
    #: plain torch ops, no state changed
    compiled_scoring: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config

    @abstractmethod
    def sampled(self, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """Per-positive losses (n,) from scores (n,) and their negatives' scores (n, K)."""

    def all_entities(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-query losses (n,) from scores (n, E) against every entity; `labels` is (n,)
        the true entity of each query (1vsAll) or (n, E) label rows y (KvsAll)."""
        raise ConfigError(
            f"task.loss.kind: loss {self.config.kind!r} pairs a positive with sampled "
            'negatives: use it with task.training.type = "negative_sampling"'
        )


class MarginRankingLoss(KGELoss):
    """sum_k w_k max(0, margin - s_pos + s_k)   (TransE's loss)."""

    config_class = MarginRankingLossConfig
    compiled_scoring = True

    def sampled(self, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        weights = negative_weights(negatives, self.config.adversarial_temperature)
        hinge = F.relu(self.config.margin - positive[:, None] + negatives)
        return (weights * hinge).sum(dim=-1)


class LogisticLoss(KGELoss):
    """softplus(-(gamma + s_pos)) + sum_k w_k softplus(gamma + s_k)   (RotatE's, with gamma and
    self-adversarial weights; DistMult's/ComplEx's with gamma = 0)."""

    config_class = LogisticLossConfig
    compiled_scoring = True

    def sampled(self, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        weights = negative_weights(negatives, self.config.adversarial_temperature)
        shift = self.config.margin
        negative_part = (weights * F.softplus(negatives + shift)).sum(dim=-1)
        return F.softplus(-(positive + shift)) + negative_part


class SoftmaxLoss(KGELoss):
    """Cross-entropy of the positive against its candidates.

    Sampled: -s_pos + logsumexp(s_pos, s_1..s_K). Every entity: -sum_e y_e log softmax(s)_e
    with y normalised to sum 1 (with one true entity: its cross-entropy; LibKGE's `kl` up to
    the labels' entropy, a constant).
    """

    config_class = SoftmaxLossConfig
    compiled_scoring = True

    def sampled(self, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        logits = torch.cat([positive[:, None], negatives], dim=-1)
        return torch.logsumexp(logits, dim=-1) - positive

    def all_entities(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if labels.dim() == 1:
            return F.cross_entropy(scores, labels, reduction="none")
        target = labels / labels.sum(dim=-1, keepdim=True)
        return -(target * F.log_softmax(scores, dim=-1)).sum(dim=-1)


class BCELoss(KGELoss):
    """Binary cross-entropy, c the offset. Sampled: softplus(-(s_pos + c)) + sum_k
    softplus(s_k + c). Every entity: sum_e y_e softplus(-(s_e + c)) + (1 - y_e) softplus(s_e + c).
    """

    config_class = BCELossConfig
    compiled_scoring = True

    def sampled(self, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        shift = self.config.offset
        return F.softplus(-(positive + shift)) + F.softplus(negatives + shift).sum(dim=-1)

    def all_entities(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = scores + self.config.offset
        if labels.dim() == 1:  # one-hot: every entity a 0 but the true one
            true = shifted.gather(1, labels[:, None])[:, 0]
            return F.softplus(shifted).sum(dim=-1) - true
        return (F.softplus(shifted) - labels * shifted).sum(dim=-1)


def build_kge_loss(config: KGELossConfig) -> KGELoss:
    """The loss `config` names (shoal's own or a `shoal.kge_losses` plugin)."""
    loss: KGELoss = KGE_LOSSES.load(config.kind)(config)
    return loss


def sampled_loss(
    config: KGELossConfig, positive: torch.Tensor, negatives: torch.Tensor
) -> torch.Tensor:
    """Per-positive losses, shape (n,), from scores (n,) and (n, K) (`KGELoss.sampled`)."""
    return build_kge_loss(config).sampled(positive, negatives)


def all_entities_loss(
    config: KGELossConfig, scores: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Per-query losses, shape (n,), from scores (n, E) against every entity
    (`KGELoss.all_entities`)."""
    return build_kge_loss(config).all_entities(scores, labels)


def _entries(
    config: RegularizationConfig, model: KGEModel, rows: torch.Tensor, table: str
) -> torch.Tensor | None:
    """The numbers the penalty raises to the power p: moduli for n3 on complex models."""
    magnitudes = model.magnitudes(rows, table)
    if magnitudes is None:
        return None
    return magnitudes if config.kind == "n3" else rows


def penalty(
    config: RegularizationConfig | None,
    model: KGEModel,
    entities: list[torch.Tensor],
    relations: list[torch.Tensor],
) -> torch.Tensor:
    """Per-sample penalty, shape (n,) or a scalar 0, on the rows each sample uses.

    weight * sum |x|^p over its entity rows (each (n, w)) plus relation_weight * the same
    over its relation rows. Weighted regularization: a row counts once per use.
    """
    zero = torch.zeros((), device=entities[0].device)
    if config is None or not config.weighted:
        return zero
    return _penalty_sum(config, model, entities, relations, per_row=True)


def table_penalty(config: RegularizationConfig | None, model: KGEModel) -> torch.Tensor:
    """The unweighted penalty: both whole tables, once (a scalar; 0 if weighted or none)."""
    if config is None or config.weighted:
        return torch.zeros((), device=model.entity.weight.device)
    entities = model.prepare_entities(model.entity.weight)
    return _penalty_sum(config, model, [entities], [model.relation.weight], per_row=False)


def _penalty_sum(
    config: RegularizationConfig,
    model: KGEModel,
    entities: list[torch.Tensor],
    relations: list[torch.Tensor],
    per_row: bool,
) -> torch.Tensor:
    power = config.exponent
    relation_weight = config.weight if config.relation_weight is None else config.relation_weight
    total = torch.zeros((), device=entities[0].device)
    for weight, table, parts in (
        (config.weight, "entity", entities),
        (relation_weight, "relation", relations),
    ):
        if weight == 0:
            continue
        for rows in parts:
            values = _entries(config, model, rows, table)
            if values is None:
                continue
            raised = values.abs().pow(power)
            total = total + weight * (raised.sum(dim=-1) if per_row else raised.sum())
    return total
