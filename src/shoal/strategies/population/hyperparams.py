"""The hyperparameters a population may tune, and how a new value reaches a live member.

Optimizer hyperparameters are set in the optimizer's param_groups, so the next
step uses them and the optimizer's state (momentum buffers, Adam moments) is
kept. The learning rate is the schedule's *peak*: warm-up and decay keep shaping
it, from the member's own step. Task parameters (dropout, ...) are named by the
task (`Task.tunable`) and set on the member's model by `Task.set_tunable`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.config.root import ShoalConfig
from shoal.errors import ConfigError
from shoal.registry import Registry
from shoal.strategies.population.space import Hyperparameters, bounds
from shoal.tasks.base import Task
from shoal.tasks.registry import task_class as _task_class
from shoal.training.learner import Learner


@dataclass(frozen=True)
class OptimizerKnob:
    """One optimizer hyperparameter: which optimizers have it, its valid values, how it is set."""

    optimizers: tuple[str, ...]
    low: float
    high: float  # exclusive when `high_open`
    high_open: bool
    apply: Callable[[torch.optim.Optimizer, Learner, float], None]


def _set_lr(optimizer: torch.optim.Optimizer, learner: Learner, value: float) -> None:
    """The peak lr becomes `value`; the current lr follows the schedule at this member's step."""
    scheduler = learner.scheduler
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
    scheduler.base_lrs = [value for _ in scheduler.base_lrs]
    for group in optimizer.param_groups:
        group["initial_lr"] = value
        group["lr"] = value * factor
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _set_group(key: str) -> Callable[[torch.optim.Optimizer, Learner, float], None]:
    def apply(optimizer: torch.optim.Optimizer, learner: Learner, value: float) -> None:
        for group in optimizer.param_groups:
            group[key] = value

    return apply


def _set_beta(index: int) -> Callable[[torch.optim.Optimizer, Learner, float], None]:
    def apply(optimizer: torch.optim.Optimizer, learner: Learner, value: float) -> None:
        for group in optimizer.param_groups:
            betas = list(group["betas"])
            betas[index] = value
            group["betas"] = (betas[0], betas[1])

    return apply


ALL = ("sgd", "adam", "adamw", "adagrad")
ADAM = ("adam", "adamw")
INF = float("inf")

OPTIMIZER_KNOBS: Registry[OptimizerKnob] = Registry("optimizer hyperparameter")
OPTIMIZER_KNOBS.add("lr", OptimizerKnob(ALL, 0.0, INF, True, _set_lr))
OPTIMIZER_KNOBS.add("weight_decay", OptimizerKnob(ALL, 0.0, INF, True, _set_group("weight_decay")))
OPTIMIZER_KNOBS.add("momentum", OptimizerKnob(("sgd",), 0.0, 1.0, True, _set_group("momentum")))
OPTIMIZER_KNOBS.add("beta1", OptimizerKnob(ADAM, 0.0, 1.0, True, _set_beta(0)))
OPTIMIZER_KNOBS.add("beta2", OptimizerKnob(ADAM, 0.0, 1.0, True, _set_beta(1)))


def tunable_names(config: ShoalConfig) -> list[str]:
    """Every hyperparameter this job's optimizer and task let a population tune."""
    kind = config.train.optimizer.kind
    names = [n for n in OPTIMIZER_KNOBS.names() if kind in OPTIMIZER_KNOBS.get(n).optimizers]
    task_class = _task_class(config.task)
    return sorted([*names, *getattr(task_class, "tunable", {})])


def check_search_space(config: ShoalConfig, field: str = "strategy.search_space") -> None:
    """Every name in the search space is tunable in this job, and its range is valid for it."""
    space = getattr(config.strategy, "search_space", {})
    kind = config.train.optimizer.kind
    task_class = _task_class(config.task)
    task_tunable: dict[str, tuple[float, float]] = getattr(task_class, "tunable", {})
    for name, dist in space.items():
        where = f"{field}.{name}"
        if name in task_tunable:
            low, high = task_tunable[name]
            high_open = True
        elif name in OPTIMIZER_KNOBS.names():
            knob = OPTIMIZER_KNOBS.get(name)
            if kind not in knob.optimizers:
                raise ConfigError(
                    f"{where}: the {kind} optimizer has no {name} (train.optimizer.kind); "
                    f"tunable here: {', '.join(tunable_names(config))}"
                )
            low, high, high_open = knob.low, knob.high, knob.high_open
        else:
            raise ConfigError(
                f"{where}: unknown hyperparameter {name!r}; tunable here: "
                f"{', '.join(tunable_names(config))}"
            )
        smallest, largest = bounds(dist)
        if smallest < low or largest > high or (high_open and largest == high):
            closing = ")" if high_open else "]"
            raise ConfigError(
                f"{where}: values from {smallest:g} to {largest:g} leave {name}'s valid range "
                f"[{low:g}, {high:g}{closing}; narrow the range"
            )


def apply_hyperparameters(
    hyper: Hyperparameters, learner: Learner, task: Task, model: torch.nn.Module
) -> None:
    """Make `hyper` the hyperparameters of a live member (its optimizer and its model)."""
    for name, value in sorted(hyper.items()):
        if name in task.tunable:
            task.set_tunable(model, name, value)
        else:
            OPTIMIZER_KNOBS.get(name).apply(learner.optimizer, learner, value)
