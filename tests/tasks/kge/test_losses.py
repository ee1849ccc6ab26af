"""Losses and penalties against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from shoal.tasks.kge.config import (
    BCELossConfig,
    ComplExConfig,
    DistMultConfig,
    LogisticLossConfig,
    MarginRankingLossConfig,
    RegularizationConfig,
    SoftmaxLossConfig,
)
from shoal.tasks.kge.losses import all_entities_loss, penalty, table_penalty
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


def test_bce_against_sampled_negatives() -> None:
    """LibKGE's bce: a sum of binary cross-entropies, label 1 for the positive, 0 for each
    negative, the offset added to every score."""
    expected = _softplus(-1.0) + _softplus(0.5) + _softplus(2.0)
    assert kge_loss(BCELossConfig(), POS, NEG).item() == pytest.approx(expected)
    shifted = _softplus(-(1.0 - 1.0)) + _softplus(0.5 - 1.0) + _softplus(2.0 - 1.0)
    assert kge_loss(BCELossConfig(offset=-1.0), POS, NEG).item() == pytest.approx(shifted)


SCORES = torch.tensor([[1.0, 0.5, 2.0], [0.0, -1.0, 3.0]])  # 2 queries x 3 entities


def test_one_vs_all_losses_by_hand() -> None:
    """1vsAll: the true entity's cross-entropy against all entities; bce over all entities."""
    answers = torch.tensor([0, 2])
    e = math.exp
    softmax = all_entities_loss(SoftmaxLossConfig(), SCORES, answers)
    expected = [
        math.log(e(1.0) + e(0.5) + e(2.0)) - 1.0,
        math.log(e(0.0) + e(-1.0) + e(3.0)) - 3.0,
    ]
    torch.testing.assert_close(softmax, torch.tensor(expected))
    bce = all_entities_loss(BCELossConfig(), SCORES, answers)
    expected = [
        _softplus(-1.0) + _softplus(0.5) + _softplus(2.0),
        _softplus(0.0) + _softplus(-1.0) + _softplus(-3.0),
    ]
    torch.testing.assert_close(bce, torch.tensor(expected))


def test_kvs_all_losses_by_hand() -> None:
    """KvsAll: label rows; softmax's target is the labels normalised to sum 1; bce takes
    smoothed labels as they are."""
    labels = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    e = math.exp
    log_z = math.log(e(1.0) + e(0.5) + e(2.0))
    softmax = all_entities_loss(SoftmaxLossConfig(), SCORES, labels)
    first = -0.5 * ((1.0 - log_z) + (0.5 - log_z))
    second = math.log(e(0.0) + e(-1.0) + e(3.0)) - 3.0
    torch.testing.assert_close(softmax, torch.tensor([first, second]))
    smoothed = 0.8 * labels + 0.1  # any labels in [0, 1]

    def bce(y: float, s: float) -> float:
        return y * _softplus(-s) + (1 - y) * _softplus(s)

    expected = [
        sum(bce(float(y), float(s)) for y, s in zip(row_y, row_s, strict=True))
        for row_y, row_s in zip(smoothed, SCORES, strict=True)
    ]
    torch.testing.assert_close(
        all_entities_loss(BCELossConfig(), SCORES, smoothed), torch.tensor(expected)
    )


def test_lp_penalty_on_real_entries_and_n3_on_moduli() -> None:
    """ComplEx row (3 + 4i): lp with p = 3 takes |3|^3 + |4|^3 = 91 (LibKGE's l3 on the
    real entries), n3 the modulus 5^3 = 125; relation rows have their own weight."""
    model = build_kge_model(ComplExConfig(), 3, 2, 2, gamma=0.0)
    entity = [torch.tensor([[3.0, 4.0]])]
    relation = [torch.tensor([[1.0, -2.0]])]
    lp = RegularizationConfig(kind="lp", p=3, weight=0.1, relation_weight=0.01)
    assert penalty(lp, model, entity, relation).item() == pytest.approx(0.1 * 91 + 0.01 * 9)
    n3 = RegularizationConfig(kind="n3", weight=0.1, relation_weight=0.01)
    expected = 0.1 * 125 + 0.01 * math.sqrt(5) ** 3
    assert penalty(n3, model, entity, relation).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="p is the exponent of kind = 'lp'"):
        RegularizationConfig(kind="n3", weight=0.1, p=2)


def test_unweighted_penalty_takes_both_whole_tables_once() -> None:
    model = build_kge_model(DistMultConfig(), 3, 2, 2, gamma=0.0)
    with torch.no_grad():
        model.entity.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 0.0]]))
        model.relation.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 1.0]]))
    config = RegularizationConfig(kind="l2", weight=0.5, relation_weight=0.25, weighted=False)
    assert table_penalty(config, model).item() == pytest.approx(0.5 * 15 + 0.25 * 5)
    rows = [torch.ones(4, 2)]
    assert penalty(config, model, rows, rows).item() == 0.0  # nothing per sample
    weighted = RegularizationConfig(kind="l2", weight=0.5)
    assert table_penalty(weighted, model).item() == 0.0
