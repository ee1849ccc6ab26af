"""The training types and model options on tiny graphs, against computations by hand:
1vsAll and KvsAll losses, reciprocal relations (head queries read the inverse relation, in
training and in ranking), embedding dropout (off in evaluation), weighted regularization."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from shoal.config import load_config
from shoal.tasks.kge.config import DistMultConfig, KGETaskConfig
from shoal.tasks.kge.evaluation import rank_triples
from shoal.tasks.kge.models import KGEModel, build_kge_model, dropout
from shoal.tasks.kge.training_types import build_training_type
from shoal.tasks.kge.triples import KGData, load_kg

# entities a, b, c (ids 0, 1, 2); relation r (id 0)
TRIPLES = "a\tr\tb\na\tr\tc\nb\tr\tc\n"
ENTITIES = torch.tensor([[1.0, 2.0], [0.5, -1.0], [-1.0, 1.5]])
RELATIONS = torch.tensor([[2.0, 1.0], [-2.0, -1.0]])  # r, and (reciprocal) r^-1


def task_config(tmp_path: Path, **task: Any) -> KGETaskConfig:
    path = tmp_path / "train.txt"
    path.write_text(TRIPLES)
    base: dict[str, Any] = {
        "type": "kge",
        "dim": 2,
        "data": {"train": str(path)},
        "model": {"type": "distmult", "reciprocal": True},
        "loss": {"kind": "softmax"},
    }
    config = load_config({"task": {**base, **task}, "train": {"epochs": 1, "batch_size": 3}})
    assert isinstance(config.task, KGETaskConfig)
    return config.task


def distmult(config: KGETaskConfig, data: KGData) -> KGEModel:
    model = build_kge_model(config.model, len(data.entities), len(data.relations), 2, 0.0)
    with torch.no_grad():
        model.entity.weight.copy_(ENTITIES)
        model.relation.weight.copy_(RELATIONS[: model.relation.weight.shape[0]])
    return model


def score(h: int, r: torch.Tensor, t: int) -> float:
    return float((ENTITIES[h] * r * ENTITIES[t]).sum())


def cross_entropy(scores: list[float], answer: int) -> float:
    return math.log(sum(math.exp(s) for s in scores)) - scores[answer]


def test_one_vs_all_loss_by_hand(tmp_path: Path) -> None:
    """Each triple: its tail query with r against every entity, its head query as the tail
    query of r^-1 (reciprocal), each a cross-entropy with the true entity."""
    config = task_config(tmp_path, training="1vsAll")
    data = load_kg(config.data)
    training = build_training_type(config, data, seed=0)
    model = distmult(config, data)
    indices = torch.arange(3)
    out = training.loss(model, training.batch(indices, torch.device("cpu")))
    r, inverse = RELATIONS
    expected = 0.0
    for h, _, t in data.train.tolist():
        expected += cross_entropy([score(h, r, e) for e in range(3)], t)
        expected += cross_entropy([score(t, inverse, e) for e in range(3)], h)
    assert out.count == 3
    assert out.loss_sum.item() == pytest.approx(expected, rel=1e-6)


def test_kvs_all_queries_labels_and_loss_by_hand(tmp_path: Path) -> None:
    """a-r->b, a-r->c, b-r->c: tail queries (a, r, ?) {b, c}, (b, r, ?) {c}; head queries
    (?, r, b) {a}, (?, r, c) {a, b}; four samples; bce with labels (1 - 0.3) y + 1/3."""
    config = task_config(
        tmp_path, training={"type": "KvsAll", "label_smoothing": 0.3}, loss={"kind": "bce"}
    )
    data = load_kg(config.data)
    training = build_training_type(config, data, seed=0)
    assert training.train_size == 4
    batch = training.batch(torch.arange(4), torch.device("cpu"))
    assert batch["anchor"].tolist() == [0, 1, 1, 2]
    assert batch["head"].tolist() == [False, False, True, True]
    answers = [[1, 2], [2], [0], [0, 1]]
    labels = torch.tensor([[1.0 if e in a else 0.0 for e in range(3)] for a in answers])
    torch.testing.assert_close(batch["labels"], 0.7 * labels + 1 / 3)
    model = distmult(config, data)
    out = training.loss(model, batch)
    r, inverse = RELATIONS
    expected = 0.0
    queries = zip([0, 1, 1, 2], [False, False, True, True], 0.7 * labels + 1 / 3, strict=True)
    for anchor, head, row in queries:
        for e in range(3):
            s = score(anchor, inverse if head else r, e)
            y = float(row[e])
            expected += y * math.log1p(math.exp(-s)) + (1 - y) * math.log1p(math.exp(s))
    assert out.loss_sum.item() == pytest.approx(expected, rel=1e-6)


def test_reciprocal_head_side_trains_and_ranks_with_the_inverse_relation(tmp_path: Path) -> None:
    """Negatives on the head side only: the loss reads r^-1 (row 1), never r (row 0)."""
    config = task_config(tmp_path, negatives={"num_negatives_s": 2, "num_negatives_o": 0})
    data = load_kg(config.data)
    training = build_training_type(config, data, seed=0)
    model = distmult(config, data)
    training.loss(model, training.batch(torch.arange(3), torch.device("cpu"))).loss_sum.backward()
    grad = model.relation.weight.grad
    assert grad is not None and grad[0].abs().sum() == 0 and grad[1].abs().sum() > 0
    # ranking (b, r, c) unfiltered. Tail side: v_b . r . v_e = [-1, 1.5, -2.5], c ranks 3rd.
    # Head side: v_e . r^-1 . v_c = [-1, 2.5, -4.25], b ranks 1st; with r, [1, -2.5, 4.25]: 3rd
    r, inverse = RELATIONS
    assert [score(1, r, e) for e in range(3)] == pytest.approx([-1.0, 1.5, -2.5])
    assert [score(e, inverse, 2) for e in range(3)] == pytest.approx([-1.0, 2.5, -4.25])
    assert [score(e, r, 2) for e in range(3)] == pytest.approx([1.0, -2.5, 4.25])
    query = torch.tensor([[1, 0, 2]])
    cpu = torch.device("cpu")
    model.eval()
    assert rank_triples(model, query, None, 0, 1, 1, 1 << 20, cpu).tolist() == [3.0, 1.0]
    plain = build_kge_model(DistMultConfig(), 3, 1, 2, 0.0)
    with torch.no_grad():
        plain.entity.weight.copy_(ENTITIES)
        plain.relation.weight.copy_(RELATIONS[:1])
    assert rank_triples(plain, query, None, 0, 1, 1, 1 << 20, cpu).tolist() == [3.0, 3.0]


def test_dropout_only_while_training() -> None:
    config = DistMultConfig(entity_dropout=0.4, relation_dropout=0.25)
    model = build_kge_model(config, 50, 4, 64, 0.0)
    rows = torch.ones(50, 64)
    model.train()
    dropped = model.drop_entities(rows)
    kept = dropped != 0
    assert 0.5 < kept.float().mean().item() < 0.7
    scale = 32768 / (32768 - round(0.4 * 32768))  # p in steps of 2^-15: 1 / (1 - p) to 1e-5
    assert scale == pytest.approx(1 / (1 - 0.4), rel=2e-5)
    torch.testing.assert_close(dropped[kept], torch.full_like(dropped[kept], scale))
    assert not torch.equal(model.drop_relations(rows), rows)
    model.eval()
    assert torch.equal(model.drop_entities(rows), rows)
    assert torch.equal(model.drop_relations(rows), rows)


def test_dropout_keeps_the_expectation() -> None:
    torch.manual_seed(0)
    x = torch.randn(400, 500).abs()
    assert dropout(x, 0.3).mean().item() == pytest.approx(x.mean().item(), rel=0.01)
    assert torch.equal(dropout(x, 0.0), x)


def test_weighted_regularization_counts_each_use(tmp_path: Path) -> None:
    """Per positive: weight * (|h|^2 + |t|^2) + relation_weight * (|r|^2 + |r^-1|^2); entity
    a heads two triples, so its row counts twice."""
    config = task_config(
        tmp_path,
        negatives={"num_negatives": 2},
        regularization={"kind": "l2", "weight": 0.1, "relation_weight": 0.01},
    )
    plain = task_config(tmp_path, negatives={"num_negatives": 2})
    data = load_kg(config.data)
    batch = build_training_type(plain, data, 0).batch(torch.arange(3), torch.device("cpu"))
    with_penalty = build_training_type(config, data, 0).loss(distmult(config, data), batch)
    without = build_training_type(plain, data, 0).loss(distmult(plain, data), batch)
    squares = ENTITIES.square().sum(dim=1)
    relation = float(RELATIONS.square().sum())
    expected = sum(0.1 * (squares[h] + squares[t]) + 0.01 * relation for h, _, t in data.train)
    assert (with_penalty.loss_sum - without.loss_sum).item() == pytest.approx(float(expected))


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            {"training": "1vsAll", "loss": {"kind": "margin_ranking"}},
            "loss 'margin_ranking' pairs a positive with sampled negatives",
        ),
        ({"training": "KvsAll", "negatives": {"num_negatives": 3}}, "remove task.negatives"),
        (
            {"negatives": {"num_negatives": 3, "num_negatives_o": 4}},
            "num_negatives pick one side per positive",
        ),
        ({"training": "1vsAll", "sparse_gradients": True}, "every row has a gradient"),
    ],
)
def test_inconsistent_training_settings_are_refused(
    tmp_path: Path, task: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        task_config(tmp_path, **task)
