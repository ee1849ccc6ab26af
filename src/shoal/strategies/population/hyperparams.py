"""How a new hyperparameter value reaches a live member (which names are tunable, and their
ranges, is `knobs.py`'s, checked with the config).

Optimizer hyperparameters are set in the optimizer's param_groups, so the next
step uses them and the optimizer's state (momentum buffers, Adam moments) is
kept. The learning rate is the schedule's *peak*: warm-up and decay keep shaping
it, from the member's own step. Task parameters (dropout, ...) are named by the
task's config (`tunable`) and set on the member's model by `Task.set_tunable`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shoal.protocols.task import Task
from shoal.strategies.population.space import Hyperparameters
from shoal.training.learner import Learner

#: (optimizer, the member's learner, value) -> None
Setter = Callable[[torch.optim.Optimizer, Learner, float], None]


def _set_lr(optimizer: torch.optim.Optimizer, learner: Learner, value: float) -> None:
    """The peak lr becomes `value`; the current lr follows the schedule at this member's step."""
    scheduler = learner.scheduler
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
    scheduler.base_lrs = [value for _ in scheduler.base_lrs]
    for group in optimizer.param_groups:
        group["initial_lr"] = value
        group["lr"] = value * factor
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _set_group(key: str) -> Setter:
    def apply(optimizer: torch.optim.Optimizer, learner: Learner, value: float) -> None:
        for group in optimizer.param_groups:
            group[key] = value

    return apply


def _set_beta(index: int) -> Setter:
    def apply(optimizer: torch.optim.Optimizer, learner: Learner, value: float) -> None:
        for group in optimizer.param_groups:
            betas = list(group["betas"])
            betas[index] = value
            group["betas"] = (betas[0], betas[1])

    return apply


#: how each optimizer hyperparameter of `knobs.KNOBS` is set
SETTERS: dict[str, Setter] = {
    "lr": _set_lr,
    "weight_decay": _set_group("weight_decay"),
    "momentum": _set_group("momentum"),
    "beta1": _set_beta(0),
    "beta2": _set_beta(1),
}


def apply_hyperparameters(
    hyper: Hyperparameters, learner: Learner, task: Task, model: torch.nn.Module
) -> None:
    """Make `hyper` the hyperparameters of a live member (its optimizer and its model)."""
    for name, value in sorted(hyper.items()):
        if name in SETTERS:
            SETTERS[name](learner.optimizer, learner, value)
        else:  # the task's own (knobs.check_search_space let no other name through)
            task.set_tunable(model, name, value)
