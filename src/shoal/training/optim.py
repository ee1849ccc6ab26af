"""Optimizer and learning-rate schedule from `[train]`."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from shoal.config.train import (
    OptimizerConfig,
    PlateauConfig,
    TrainConfig,
)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer:
    """The torch optimizer a `[train.optimizer]` section names, with its arguments."""
    optimizer: torch.optim.Optimizer = getattr(torch.optim, config.torch_class)(
        list(params), **config.arguments()
    )
    return optimizer


class WarmupDecay:
    """Learning-rate factor: linear warm-up from 0, then constant, linear, cosine or plateau decay.

    A plain object (not a lambda) so LambdaLR saves and restores it in checkpoints:
    its attributes are plain numbers, so the plateau state (current scale, best
    metric, evaluations without improvement, cooldown left) travels in every
    checkpoint and a resumed run lowers the rate exactly when an uninterrupted one
    would. Plateau follows torch's ReduceLROnPlateau (relative threshold): after an
    evaluation that does not beat best * (1 +- threshold), a count of bad evaluations
    grows; when it exceeds `patience`, the scale is multiplied by `factor` (not below
    min_ratio) and `cooldown` evaluations pass before counting again.
    """

    def __init__(
        self,
        warmup_steps: int,
        total_steps: int,
        decay: str,
        min_ratio: float,
        plateau: PlateauConfig | None = None,
    ) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay = decay
        self.min_ratio = min_ratio
        plateau = plateau or PlateauConfig()
        self.plateau_factor = plateau.factor
        self.plateau_patience = plateau.patience
        self.plateau_threshold = plateau.threshold
        self.plateau_cooldown = plateau.cooldown
        self.scale = 1.0  # plateau: the product of the reductions so far
        self.best: float | None = None
        self.bad_evaluations = 0
        self.cooldown_left = 0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps * self.scale
        if self.decay in ("constant", "plateau"):
            return self.scale
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * shape

    def observe(self, value: float, direction: str) -> bool:
        """Plateau: take one evaluation's metric (`direction` "max" or "min"); True when the
        rate was lowered."""
        if self.decay != "plateau" or math.isnan(value):
            return False
        if self.best is None or (
            value > self.best * (1.0 + self.plateau_threshold)
            if direction == "max"
            else value < self.best * (1.0 - self.plateau_threshold)
        ):
            self.best, self.bad_evaluations = value, 0
        else:
            self.bad_evaluations += 1
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.bad_evaluations = 0
        if self.bad_evaluations > self.plateau_patience:
            lowered = max(self.scale * self.plateau_factor, self.min_ratio)
            self.bad_evaluations = 0
            self.cooldown_left = self.plateau_cooldown
            if lowered < self.scale:
                self.scale = lowered
                return True
        return False

    def take_state(self, other: WarmupDecay) -> None:
        """Continue `other`'s plateau (a resumed run whose schedule follows the new config)."""
        self.scale, self.best = other.scale, other.best
        self.bad_evaluations, self.cooldown_left = other.bad_evaluations, other.cooldown_left


def build_factor(config: TrainConfig, total_steps: int) -> WarmupDecay:
    return WarmupDecay(
        config.warmup_steps, total_steps, config.lr_decay, config.min_lr_ratio, config.plateau
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, build_factor(config, total_steps))
