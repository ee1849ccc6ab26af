"""A parameter-server worker's prefetch reads the next batch from the epoch's plan, made once
an epoch: a plan shuffles the whole epoch's order, which per step cost more than the step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shoal.strategies.parameter_server import learner as learner_module
from shoal.strategies.parameter_server.learner import ServerLearner
from shoal.training.batching import EpochPlan


def test_the_prefetch_makes_one_plan_an_epoch_with_the_trainers_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[int] = []

    class Counted(EpochPlan):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(args[2])  # the epoch
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(learner_module, "EpochPlan", Counted)
    train = SimpleNamespace(batch_size=10, seed=3, shuffle=True, drop_last=False)
    learner = ServerLearner.__new__(ServerLearner)
    learner.task = SimpleNamespace(train_size=95)  # type: ignore[assignment]
    learner.train = train  # type: ignore[assignment]
    learner.steps_per_epoch = 10
    learner._plan = None
    for step in range(25):
        epoch, index = divmod(step, 10)
        expected = EpochPlan(95, 10, epoch, 3, True, False).global_batch(index)
        assert learner._global_batch(step).tolist() == expected.tolist()
    assert made == [0, 1, 2]
