"""Losses and penalties against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from shoal.tasks.kge.config import (
    DistMultConfig,
    LogisticLossConfig,
    MarginRankingLossConfig,
    RegularizationConfig,
    SoftmaxLossConfig,
)
from shoal.tasks.kge.losses import penalty
from shoal.tasks.kge.losses import sampled_loss as kge_loss
from shoal.tasks.kge.models import build_kge_model

POS = torch.tensor([1.0])
NEG = torch.tensor([[0.5, 2.0]])


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_margin_ranking() -> None:
    # max(0, 1 - 1 + 0.5) = 0.5 and max(0, 1 - 1 + 2) = 2, averaged
    assert kge_loss(MarginRankingLossConfig(margin=1.0), POS, NEG).item() == pytest.approx(1.25)


def test_self_adversarial_weights_favour_hard_negatives() -> None:
    config = MarginRankingLossConfig(margin=1.0, adversarial_temperature=1.0)
    w = [math.exp(0.5), math.exp(2.0)]
    expected = (w[0] * 0.5 + w[1] * 2.0) / sum(w)
    assert kge_loss(config, POS, NEG).item() == pytest.approx(expected)
    neg = NEG.clone().requires_grad_()
    kge_loss(config, POS, neg).sum().backward()
    # no gradient through the weights: d/ds_k = w_k for active hinges
    torch.testing.assert_close(neg.grad, torch.tensor([[w[0] / sum(w), w[1] / sum(w)]]))


def test_logistic_with_and_without_gamma() -> None:
    plain = kge_loss(LogisticLossConfig(), POS, NEG).item()
    assert plain == pytest.approx(_softplus(-1.0) + (_softplus(0.5) + _softplus(2.0)) / 2)
    rotate = kge_loss(LogisticLossConfig(margin=3.0), POS, NEG).item()
    assert rotate == pytest.approx(_softplus(-4.0) + (_softplus(3.5) + _softplus(5.0)) / 2)


def test_softmax_cross_entropy() -> None:
    expected = math.log(math.exp(1.0) + math.exp(0.5) + math.exp(2.0)) - 1.0
    assert kge_loss(SoftmaxLossConfig(), POS, NEG).item() == pytest.approx(expected)


def test_l2_and_n3_penalties() -> None:
    model = build_kge_model(DistMultConfig(), 3, 2, 2, gamma=0.0)
    entities = [torch.tensor([[1.0, -2.0]]), torch.tensor([[0.0]])]
    relations = [torch.tensor([[3.0]])]
    l2 = RegularizationConfig(kind="l2", weight=0.1)
    n3 = RegularizationConfig(kind="n3", weight=0.1)
    assert penalty(l2, model, entities, relations).item() == pytest.approx(1.4)
    assert penalty(n3, model, entities, relations).item() == pytest.approx(3.6)
    assert penalty(None, model, entities, relations).item() == 0.0
