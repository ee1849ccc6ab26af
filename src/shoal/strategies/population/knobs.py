"""Which hyperparameters a population may tune, checked from the config alone.

An optimizer hyperparameter is tunable where the job's optimizer has it; a task
parameter (dropout, ...) where the task's config section names it (`tunable`).
Both are known before any worker starts, so `shoal config validate` refuses a
search space the job cannot tune, at the field that names it. How a new value
reaches a live member is `hyperparams.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.config.base import FieldError, task_section


@dataclass(frozen=True)
class Knob:
    """One optimizer hyperparameter: which optimizers have it and its valid values."""

    optimizers: tuple[str, ...]
    low: float
    high: float  # exclusive when `high_open`
    high_open: bool


ALL = ("sgd", "adam", "adamw", "adagrad")
ADAM = ("adam", "adamw")
INF = float("inf")

#: the optimizer hyperparameters, by the name a search space gives them
KNOBS: dict[str, Knob] = {
    "lr": Knob(ALL, 0.0, INF, True),
    "weight_decay": Knob(ALL, 0.0, INF, True),
    "momentum": Knob(("sgd",), 0.0, 1.0, True),
    "beta1": Knob(ADAM, 0.0, 1.0, True),
    "beta2": Knob(ADAM, 0.0, 1.0, True),
}


def task_tunable(config: Any) -> dict[str, tuple[float, float]]:
    """The task's tunable parameters with their ranges [low, high)."""
    tunable: dict[str, tuple[float, float]] = getattr(task_section(config), "tunable", {})
    return tunable


def tunable_names(config: Any) -> list[str]:
    """Every hyperparameter this job's optimizer and task let a population tune."""
    kind = config.train.optimizer.kind
    names = [name for name, knob in KNOBS.items() if kind in knob.optimizers]
    return sorted([*names, *task_tunable(config)])


def check_search_space(config: Any) -> None:
    """Every name in `strategy.search_space` is tunable in this job, and its range is valid."""
    space = getattr(config.strategy, "search_space", {})
    kind = config.train.optimizer.kind
    from_task = task_tunable(config)
    for name, dist in space.items():
        where = ("strategy", "search_space", name)
        if name in from_task:
            low, high = from_task[name]
            high_open = True
        elif name in KNOBS:
            knob = KNOBS[name]
            if kind not in knob.optimizers:
                raise FieldError(
                    where,
                    f"the {kind} optimizer has no {name} (train.optimizer.kind); tunable here: "
                    f"{', '.join(tunable_names(config))}",
                )
            low, high, high_open = knob.low, knob.high, knob.high_open
        else:
            raise FieldError(
                where,
                f"unknown hyperparameter {name!r}; tunable here: "
                f"{', '.join(tunable_names(config))}",
            )
        smallest, largest = dist.bounds()
        if smallest < low or largest > high or (high_open and largest == high):
            closing = ")" if high_open else "]"
            raise FieldError(
                where,
                f"values from {smallest:g} to {largest:g} leave {name}'s valid range "
                f"[{low:g}, {high:g}{closing}; narrow the range",
            )


def resolve_metric(section: Any, primary: tuple[str, str]) -> tuple[str, str]:
    """The metric that ranks members and its direction: the section's, else the task's
    `primary` (metric, direction)."""
    metric = section.metric or primary[0]
    if section.mode is not None:
        return metric, section.mode
    if metric == primary[0]:
        return metric, primary[1]
    if metric == "loss":
        return metric, "min"
    raise FieldError(
        ("strategy", "mode"),
        f'required with metric = {metric!r}: set mode = "max" if a higher {metric} is '
        'better, else mode = "min"',
    )


def primary_metric(config: Any) -> tuple[str, str]:
    """The task's primary metric and its direction, from its config section."""
    primary: tuple[str, str] = getattr(task_section(config), "primary_metric", ("loss", "min"))
    return primary
