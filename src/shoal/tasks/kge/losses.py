"""Losses over (positive score, negative scores) and penalties on the rows a batch uses.

Each loss is per positive triple and the task sums it over the batch (the
trainer divides by the global batch size). The K negatives of a positive enter
through weights w_k that sum to 1: uniform (1/K), or self-adversarial,
w = softmax(alpha * negative scores) with no gradient through w (Sun et al.,
2019), which spends the loss on the negatives the model finds most plausible.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shoal.tasks.kge.config import (
    KGELossConfig,
    LogisticLossConfig,
    MarginRankingLossConfig,
    RegularizationConfig,
)


def negative_weights(negatives: torch.Tensor, temperature: float | None) -> torch.Tensor:
    """(n, K) weights summing to 1 per row: uniform, or self-adversarial (detached softmax)."""
    if temperature is None:
        return torch.full_like(negatives, 1.0 / negatives.shape[-1])
    return torch.softmax(temperature * negatives.detach(), dim=-1)


def kge_loss(
    config: KGELossConfig, positive: torch.Tensor, negatives: torch.Tensor
) -> torch.Tensor:
    """Per-positive losses, shape (n,), from scores (n,) and (n, K); higher score = more plausible.

    - margin_ranking: sum_k w_k max(0, margin - s_pos + s_k)   (TransE's loss)
    - logistic: softplus(-(gamma + s_pos)) + sum_k w_k softplus(gamma + s_k)   (RotatE's, with
      gamma and self-adversarial weights; DistMult's/ComplEx's with gamma = 0)
    - softmax: -s_pos + logsumexp(s_pos, s_1..s_K)   (cross-entropy against the negatives)
    """
    if isinstance(config, MarginRankingLossConfig):
        weights = negative_weights(negatives, config.adversarial_temperature)
        hinge = F.relu(config.margin - positive[:, None] + negatives)
        return (weights * hinge).sum(dim=-1)
    if isinstance(config, LogisticLossConfig):
        weights = negative_weights(negatives, config.adversarial_temperature)
        shift = config.margin
        negative_part = (weights * F.softplus(negatives + shift)).sum(dim=-1)
        return F.softplus(-(positive + shift)) + negative_part
    logits = torch.cat([positive[:, None], negatives], dim=-1)
    return torch.logsumexp(logits, dim=-1) - positive


def penalty(config: RegularizationConfig | None, magnitudes: list[torch.Tensor]) -> torch.Tensor:
    """Per-positive penalty, shape (n,): weight * sum |x|^2 (l2) or |x|^3 (n3) over its rows."""
    if config is None or config.weight == 0:
        return torch.zeros((), device=magnitudes[0].device)
    power = 2 if config.kind == "l2" else 3
    total = sum(x.abs().pow(power).sum(dim=-1) for x in magnitudes)
    assert isinstance(total, torch.Tensor)
    return config.weight * total
