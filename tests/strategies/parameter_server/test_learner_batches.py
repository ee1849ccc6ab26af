"""A worker's global batches: its epoch's order is made once per epoch, not once per step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from shoal.config.train import TrainConfig
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
    served: Any = SimpleNamespace(client=None)
    learner = ServerLearner(task, None, None, served, train, None, (0, 1))  # type: ignore[arg-type]

    batches = [learner._global_batch(step) for step in range(9)]

    assert epochs_ordered == [0, 1, 2]
    for step, batch in enumerate(batches):
        epoch, index = divmod(step, 3)
        assert torch.equal(batch, EpochPlan(10, 4, epoch, 3).global_batch(index))
