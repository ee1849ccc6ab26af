"""New hyperparameters reach a live member (states crossing ranks: tests/comm/test_codec.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch import nn

from shoal.config import load_config
from shoal.errors import ConfigError
from shoal.strategies.population.hyperparams import apply_hyperparameters
from shoal.tasks.classification.task import ClassificationTask
from shoal.training.contracts import LocalGradientSync
from shoal.training.learner import Learner
from tests.conftest import small_job


def _population(runs: Path, space: dict[str, Any], optimizer: dict[str, Any], **train: Any) -> Any:
    strategy = {"type": "population_based", "population_size": 4, "search_space": space}
    return load_config(small_job(runs, strategy=strategy, train={"optimizer": optimizer, **train}))


def _learner(model: nn.Module, config: Any) -> Learner:
    return Learner(None, model, LocalGradientSync(model), config.train, 100)  # type: ignore[arg-type]


def test_new_lr_is_the_peak_of_the_running_schedule(runs: Path) -> None:
    config = _population(
        runs,
        {"lr": {"kind": "log", "low": 1e-3, "high": 1.0}},
        {"kind": "sgd", "lr": 0.1},
        warmup_steps=10,
    )
    model = nn.Linear(3, 2)
    learner = _learner(model, config)
    for _ in range(3):
        learner.optimizer.step()
        learner.scheduler.step()
    task = ClassificationTask.__new__(ClassificationTask)
    apply_hyperparameters({"lr": 0.5}, learner, task, model)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 4 / 10)
    assert learner.lr == pytest.approx(0.5 * 4 / 10)
    learner.optimizer.step()
    learner.scheduler.step()
    assert learner.lr == pytest.approx(0.5 * 5 / 10), "warm-up goes on towards the new peak"


def test_optimizer_and_task_hyperparameters_reach_the_live_member(runs: Path) -> None:
    space = {"momentum": {"kind": "linear", "low": 0.0, "high": 0.9}}
    config = _population(runs, space, {"kind": "sgd", "lr": 0.1, "momentum": 0.5})
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1), nn.Linear(4, 2))
    learner = _learner(model, config)
    task = ClassificationTask.__new__(ClassificationTask)
    apply_hyperparameters(
        {"momentum": 0.8, "weight_decay": 0.01, "dropout": 0.3}, learner, task, model
    )
    group = learner.optimizer.param_groups[0]
    assert (group["momentum"], group["weight_decay"]) == (0.8, 0.01)
    assert model[1].p == 0.3

    adam = _population(
        runs, {"beta1": {"kind": "linear", "low": 0.8, "high": 0.95}}, {"kind": "adam"}
    )
    learner = _learner(model, adam)
    apply_hyperparameters({"beta1": 0.85, "beta2": 0.99}, learner, task, model)
    assert learner.optimizer.param_groups[0]["betas"] == (0.85, 0.99)


@pytest.mark.parametrize(
    ("space", "optimizer", "message"),
    [
        (
            {"momentum": {"kind": "linear", "low": 0.1, "high": 0.9}},
            {"kind": "adam"},
            "strategy.search_space.momentum: the adam optimizer has no momentum "
            "(train.optimizer.kind); tunable here: beta1, beta2, dropout, lr, weight_decay",
        ),
        (
            {"warmup": {"kind": "linear", "low": 1, "high": 9}},
            {"kind": "sgd"},
            "strategy.search_space.warmup: unknown hyperparameter 'warmup'; tunable here: "
            "dropout, lr, momentum, weight_decay",
        ),
        (
            {"dropout": {"kind": "choice", "values": [0.0, 0.5, 1.0]}},
            {"kind": "sgd"},
            "strategy.search_space.dropout: values from 0 to 1 leave dropout's valid range "
            "[0, 1); narrow the range",
        ),
    ],
    ids=["momentum-with-adam", "unknown-name", "out-of-range"],
)
def test_search_space_is_checked_against_optimizer_and_task(
    runs: Path, space: dict[str, Any], optimizer: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:  # refused by the config's check, at the field
        _population(runs, space, optimizer)
    assert caught.value.lines == [message]
