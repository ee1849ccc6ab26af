"""Filtered ranking: ranks known by hand, ties as the mean rank, true triples filtered."""

from __future__ import annotations

import pytest
import torch

from shoal.tasks.kge.config import DistMultConfig
from shoal.tasks.kge.evaluation import (
    FilterIndex,
    metrics_from_sums,
    rank_metric_sums,
    rank_triples,
    realistic_ranks,
)
from shoal.tasks.kge.models import build_kge_model


def test_ties_count_as_the_mean_rank() -> None:
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.1, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5]])
    # row 0: target 0 (0.5): one greater, two equal -> 1 + 1 + 2/2 = 3; row 1: target 4 is best
    assert realistic_ranks(scores.clone(), torch.tensor([0, 4])).tolist() == [3.0, 1.0]
    # leaving out entity 1 and one tie of row 0 (the filter): 1 + 0 + 1/2
    ranks = realistic_ranks(
        scores.clone(), torch.tensor([0, 4]), torch.tensor([0, 0]), torch.tensor([1, 2])
    )
    assert ranks.tolist() == [1.5, 1.0]


def test_nan_scores_rank_last() -> None:
    scores = torch.tensor([[float("nan"), 0.2, 0.3]])
    assert realistic_ranks(scores, torch.tensor([0])).tolist() == [3.0]


def _one_dimensional_distmult(values: list[float]) -> torch.nn.Module:
    """DistMult of dim 2 with relation (1, 0): score(h, r, t) = v_h * v_t."""
    model = build_kge_model(DistMultConfig(), len(values), 1, 2, gamma=0.0)
    with torch.no_grad():
        model.entity.weight.copy_(torch.tensor([[v, 0.0] for v in values]))
        model.relation.weight.copy_(torch.tensor([[1.0, 0.0]]))
    return model


@pytest.mark.parametrize(("filtered", "tail_rank"), [(False, 2.5), (True, 1.5)])
def test_filtered_ranks_on_a_tiny_graph(filtered: bool, tail_rank: float) -> None:
    """Entities valued v = (1, 2, 3, 2). Test triple (0, r, 1); (0, r, 2) is a known training triple.

    Tail prediction scores v_0 * v_e = (1, 2, 3, 2): entity 2 beats the answer 1, entity 3
    ties with it -> raw rank 1 + 1 + 1/2 = 2.5; filtered (entity 2 is a true answer too)
    1 + 0 + 1/2 = 1.5. Head prediction scores v_e * v_1 = (2, 4, 6, 4): the answer 0 is last,
    rank 4, and no other known triple (?, r, 1) exists to filter.
    """
    model = _one_dimensional_distmult([1.0, 2.0, 3.0, 2.0])
    known = torch.tensor([[0, 0, 1], [0, 0, 2]])
    test = torch.tensor([[0, 0, 1]])
    answers = FilterIndex.build(known, test, num_relations=1) if filtered else None
    ranks = rank_triples(model, test, answers, 0, 1, 16, 1 << 10, torch.device("cpu"))
    assert ranks.tolist() == [tail_rank, 4.0]
    metrics = metrics_from_sums(rank_metric_sums(ranks, [1, 3]), [1, 3])
    assert metrics["mrr"] == pytest.approx((1 / tail_rank + 1 / 4) / 2)
    assert metrics["mr"] == pytest.approx((tail_rank + 4) / 2)
    assert metrics["hits@1"] == 0.0  # 1.5 and 4 are both above 1
    assert metrics["hits@3"] == 0.5


def test_filter_index_lists_every_other_true_answer() -> None:
    known = torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3], [4, 0, 3], [0, 1, 5]])
    index = FilterIndex.build(known, torch.tensor([[0, 0, 2], [4, 0, 3]]), num_relations=2)
    rows, entities = index.tails.rows(0, 2)
    assert sorted(zip(rows.tolist(), entities.tolist(), strict=True)) == [
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 3),
    ]
    rows, entities = index.heads.rows(1, 2)  # (?, 0, 3): heads 0 and 4
    assert sorted(entities.tolist()) == [0, 4] and rows.tolist() == [0, 0]


def test_ranks_do_not_depend_on_the_batch_size() -> None:
    torch.manual_seed(0)
    model = build_kge_model(DistMultConfig(), 30, 2, 8, gamma=0.0)
    triples = torch.stack(
        [torch.randint(0, 30, (40,)), torch.randint(0, 2, (40,)), torch.randint(0, 30, (40,))], 1
    )
    answers = FilterIndex.build(triples, triples, 2)
    one = rank_triples(model, triples, answers, 0, 40, 40, 1 << 20, torch.device("cpu"))
    many = rank_triples(model, triples, answers, 0, 40, 7, 1 << 20, torch.device("cpu"))
    assert sorted(one.tolist()) == sorted(many.tolist())
