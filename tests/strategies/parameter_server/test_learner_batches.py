"""A worker's global batches: its epoch's order is made once per epoch, not once per step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from shoal.config.train import TrainConfig
from shoal.errors import TrainingHalted
from shoal.strategies.parameter_server import learner as learner_module
from shoal.strategies.parameter_server.learner import ServerLearner
from shoal.training.batching import EpochPlan


def test_each_epoch_is_ordered_once_and_batches_match_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    epochs_ordered: list[int] = []

    class CountedPlan(EpochPlan):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            epochs_ordered.append(args[2])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(learner_module, "EpochPlan", CountedPlan)
    monkeypatch.setattr(learner_module, "SERVED_TABLES", SimpleNamespace(of=lambda task, _: task))
    train = TrainConfig(batch_size=4, seed=3)
    task: Any = SimpleNamespace(train_size=10)  # 3 steps an epoch, the last one short
    served: Any = SimpleNamespace(client=None, device=torch.device("cpu"))
    learner = ServerLearner(task, None, None, served, train, None, (0, 1))  # type: ignore[arg-type]

    batches = [learner._global_batch(step) for step in range(9)]

    assert epochs_ordered == [0, 1, 2]
    for step, batch in enumerate(batches):
        epoch, index = divmod(step, 3)
        assert torch.equal(batch, EpochPlan(10, 4, epoch, 3).global_batch(index))


class _Pulled:
    def __init__(self, entity: torch.Tensor, relation: torch.Tensor) -> None:
        self.entity_ids, self.relation_ids = torch.arange(len(entity)), torch.arange(len(relation))
        self.rows = (entity, relation)

    def wait(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows


class _Client:
    """What a worker's step asks of its RowClient: rows to pull, and the pushes recorded."""

    worker = 1

    def __init__(self, entity: torch.Tensor, relation: torch.Tensor) -> None:
        self.entity, self.relation = entity, relation
        self.pushed: list[tuple[torch.Tensor, ...]] = []

    def pull(self, *args: Any) -> _Pulled:
        return _Pulled(self.entity.clone(), self.relation.clone())

    def note_held(self, *tensors: torch.Tensor) -> None:
        return None

    def push(self, *args: Any) -> None:
        self.pushed.append(args)


def _learner(poison: float, on_nonfinite: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A worker whose loss is sum(entity rows * poison) + sum(relation rows)."""
    monkeypatch.setattr(learner_module, "SERVED_TABLES", SimpleNamespace(of=lambda task, _: task))
    client = _Client(torch.ones(3, 2), torch.ones(2, 2))
    served: Any = SimpleNamespace(client=client, clock=0, batch=None, device=torch.device("cpu"))

    def loss(model: Any, batch: Any) -> Any:
        entity, relation = served.batch["entity"][1], served.batch["relation"][1]
        total = (entity * poison).sum() + (relation * 2.0).sum()
        return SimpleNamespace(loss_sum=total, sums={})

    task: Any = SimpleNamespace(
        train_size=4,
        batch_unit=1,
        train_batch=lambda indices: {"triples": indices},
        rows_touched=lambda batch: (torch.arange(3), torch.arange(2)),
        loss=loss,
    )
    sync: Any = SimpleNamespace(take_sent_bytes=lambda: 0)
    config: Any = SimpleNamespace(prefetch=False)
    train = TrainConfig(batch_size=4, seed=0, on_nonfinite=on_nonfinite)
    learner = ServerLearner(task, None, sync, served, train, config, (0, 1))
    return learner, client


def test_a_finite_step_pushes_its_rows_with_their_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    learner, client = _learner(3.0, "halt", monkeypatch)
    stats = learner.step(torch.arange(4), 0)
    (entity_ids, entity_grad, relation_ids, relation_grad, clock) = client.pushed[0]
    assert clock == 0 and len(entity_ids) == 3 and len(relation_ids) == 2
    # d/d rows of (rows * w).sum() / 4 (the global batch): w / 4 everywhere
    assert torch.equal(entity_grad, torch.full((3, 2), 0.75))
    assert torch.equal(relation_grad, torch.full((2, 2), 0.5))
    assert stats.grad_norm == pytest.approx((6 * 0.75**2 + 4 * 0.5**2) ** 0.5)
    assert not stats.skipped


def test_a_nonfinite_step_halts_naming_the_table_or_pushes_no_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    learner, client = _learner(float("nan"), "halt", monkeypatch)
    with pytest.raises(TrainingHalted, match="in the entity rows on worker 1; nothing"):
        learner.step(torch.arange(4), 5)
    assert client.pushed == []
    learner, client = _learner(float("inf"), "skip_step", monkeypatch)
    stats = learner.step(torch.arange(4), 0)
    entity_ids, _, relation_ids, _, clock = client.pushed[0]
    assert clock == 0 and len(entity_ids) == len(relation_ids) == 0  # the clock, no rows
    assert stats.skipped and stats.grad_norm == 0.0
