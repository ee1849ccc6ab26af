"""Sampled filtered ranking (OGB's protocol): by hand on a tiny graph, equal to the full
ranking when every entity is a candidate, independent of the batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.tasks.kge.candidates import sample_candidates
from shoal.tasks.kge.config import DistMultConfig, TransEConfig
from shoal.tasks.kge.evaluation import FilterIndex, rank_sampled, rank_triples
from shoal.tasks.kge.models import KGEModel, build_kge_model
from shoal.tasks.kge.prepared.graph import PreparedGraph
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.sources import prepare_ids, prepare_tsv
from tests.tasks.kge.planted import write_planted_graph

CPU = torch.device("cpu")


def _tiny_graph(tmp_path: Path) -> PreparedGraph:
    """Entities 0..3, one relation; known (0, r, 2) in train; test (0, r, 1)."""
    (tmp_path / "train.txt").write_text("0\t0\t2\n")
    (tmp_path / "test.txt").write_text("0\t0\t1\n")
    (tmp_path / "entities.txt").write_text("0\ta\n1\tb\n2\tc\n3\td\n")
    files = {"train": tmp_path / "train.txt", "test": tmp_path / "test.txt"}
    prepare_ids(files, tmp_path / "g", PrepareProgress(), tmp_path / "entities.txt")
    return PreparedGraph.open(tmp_path / "g")


def _one_dimensional_distmult(values: list[float]) -> KGEModel:
    """score(h, r, t) = v_h * v_t."""
    model = build_kge_model(DistMultConfig(), len(values), 1, 2, gamma=0.0)
    with torch.no_grad():
        model.entity.weight.copy_(torch.tensor([[v, 0.0] for v in values]))
        model.relation.weight.copy_(torch.tensor([[1.0, 0.0]]))
    return model


def _expected_rank(answer_score: float, scores: list[float]) -> float:
    return 1 + sum(s > answer_score for s in scores) + sum(s == answer_score for s in scores) / 2


@pytest.mark.parametrize("count", [1, 2])
def test_sampled_ranks_by_hand(tmp_path: Path, count: int) -> None:
    """v = (1, 2, 3, 2). Tail query (0, r, ?): answer 1 scores 2; a drawn 2 is a known
    answer (filtered out), 3 ties (1/2), 0 scores less. Head query (?, r, 1): answer 0
    scores 2, every other entity more (2: 6, 3: 4, 1: 4)."""
    graph = _tiny_graph(tmp_path)
    model = _one_dimensional_distmult([1.0, 2.0, 3.0, 2.0])
    test = torch.from_numpy(np.array(graph.splits["test"]))
    ranks = rank_sampled(model, test, graph.filter, 0, 1, count, 4, 7, 16, 1 << 10, CPU)
    tails = sample_candidates(7, False, np.arange(1), np.array([1]), count, 4)[0].tolist()
    heads = sample_candidates(7, True, np.arange(1), np.array([0]), count, 4)[0].tolist()
    tail_scores = {0: 1.0, 3: 2.0}  # entity 2 is filtered
    head_scores = {1: 4.0, 2: 6.0, 3: 4.0}
    expected = [
        _expected_rank(2.0, [tail_scores[e] for e in tails if e != 2]),
        _expected_rank(2.0, [head_scores[e] for e in heads]),
    ]
    assert ranks.tolist() == expected
    assert len(tails) == len(heads) == count


@pytest.mark.parametrize(
    "model_config", [DistMultConfig(), TransEConfig(p=1)], ids=["distmult", "transe"]
)
@pytest.mark.parametrize("filtered", [True, False])
def test_every_entity_a_candidate_is_the_full_ranking(
    tmp_path: Path, model_config: DistMultConfig | TransEConfig, filtered: bool
) -> None:
    prepare_tsv(write_planted_graph(tmp_path), tmp_path / "g", PrepareProgress())
    graph = PreparedGraph.open(tmp_path / "g")
    torch.manual_seed(0)
    model = build_kge_model(model_config, graph.num_entities, graph.num_relations, 16, 1.0)
    test = torch.from_numpy(np.concatenate([graph.splits["valid"], graph.splits["test"]]))
    answers = FilterIndex.of_split(graph.filter, test) if filtered else None
    full = rank_triples(model, test, answers, 0, len(test), 7, 1 << 12, CPU)
    known = graph.filter if filtered else None
    count = graph.num_entities  # more than the entities other than the answer
    sampled = rank_sampled(
        model, test, known, 0, len(test), count, graph.num_entities, 0, 7, 1 << 12, CPU
    )
    assert torch.equal(sampled, full)
    fewer = rank_sampled(
        model, test, known, 0, len(test), 10, graph.num_entities, 0, 7, 1 << 12, CPU
    )
    assert (fewer <= full).all() and (fewer < full).any()  # fewer rivals: never a worse rank


def test_sampled_ranks_do_not_depend_on_the_batch_or_the_block(tmp_path: Path) -> None:
    prepare_tsv(write_planted_graph(tmp_path), tmp_path / "g", PrepareProgress())
    graph = PreparedGraph.open(tmp_path / "g")
    torch.manual_seed(1)
    model = build_kge_model(DistMultConfig(), graph.num_entities, graph.num_relations, 8, 1.0)
    test = torch.from_numpy(np.array(graph.splits["test"]))
    whole = rank_sampled(
        model, test, graph.filter, 0, len(test), 9, graph.num_entities, 3, 64, 1 << 20, CPU
    )
    parts = [
        rank_sampled(model, test, graph.filter, lo, hi, 9, graph.num_entities, 3, 4, 1 << 10, CPU)
        for lo, hi in ((0, 11), (11, len(test)))
    ]

    # per batch: tail ranks then head ranks; compare per triple and side
    def by_triple(ranks: torch.Tensor, sizes: list[int]) -> list[tuple[float, float]]:
        out, at = [], 0
        for size in sizes:
            out += list(
                zip(
                    ranks[at : at + size].tolist(),
                    ranks[at + size : at + 2 * size].tolist(),
                    strict=True,
                )
            )
            at += 2 * size
        return out

    n = len(test)
    batches_whole = [n]
    batches_parts = [4, 4, 3] + [4] * ((n - 11) // 4) + ([(n - 11) % 4] if (n - 11) % 4 else [])
    assert by_triple(whole, batches_whole) == by_triple(torch.cat(parts), batches_parts)
