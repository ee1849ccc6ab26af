"""Optimizer and learning-rate schedule from `[train]`."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from shoal.config.train import (
    AdagradConfig,
    AdamConfig,
    AdamWConfig,
    OptimizerConfig,
    SGDConfig,
    SparseAdamConfig,
    TrainConfig,
)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer:
    params = list(params)
    if isinstance(config, SGDConfig):
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            dampening=config.dampening,
            nesterov=config.nesterov,
            weight_decay=config.weight_decay,
        )
    if isinstance(config, AdamConfig):  # AdamW is an AdamConfig with decoupled weight decay
        adam = torch.optim.AdamW if isinstance(config, AdamWConfig) else torch.optim.Adam
        return adam(
            params,
            lr=config.lr,
            betas=(config.betas[0], config.betas[1]),
            eps=config.eps,
            weight_decay=config.weight_decay,
            amsgrad=config.amsgrad,
        )
    if isinstance(config, AdagradConfig):
        return torch.optim.Adagrad(
            params,
            lr=config.lr,
            lr_decay=config.lr_decay,
            eps=config.eps,
            weight_decay=config.weight_decay,
            initial_accumulator_value=config.initial_accumulator_value,
        )
    if isinstance(config, SparseAdamConfig):
        return torch.optim.SparseAdam(
            params, lr=config.lr, betas=(config.betas[0], config.betas[1]), eps=config.eps
        )
    raise TypeError(f"no optimizer for {type(config).__name__}")


class WarmupDecay:
    """Learning-rate factor: linear warm-up from 0, then constant, linear or cosine decay.

    A plain object (not a lambda) so LambdaLR can save and restore it in checkpoints.
    """

    def __init__(self, warmup_steps: int, total_steps: int, decay: str, min_ratio: float) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay = decay
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    factor = WarmupDecay(config.warmup_steps, total_steps, config.lr_decay, config.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
