"""`RegressionTask`: what shoal loads for `[task] type = "regression"`.

The loss is the squared error *summed* over the batch (shoal's trainer divides
by the global batch size, and strategies sum over workers: that is what makes N
workers reproduce one); divided by the target's variance when `standardize` is
on, so the learning rate does not depend on the target's units. Evaluation
reports the mean-squared error in the target's own units (`mse`, the primary
metric, lower is better), its root and R^2, summed over every worker's rows.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import torch
from torch import nn

from shoal.extend import (
    LossOutput,
    Task,
    WorkerContext,
    all_reduce_sum,
    move_to,
    rank_slice,
)
from shoal_regression.config import RegressionConfig
from shoal_regression.data import read_table

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class Standardized(nn.Module):
    """An MLP on standardized inputs whose output is back in the target's units."""

    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: torch.Tensor
    y_std: torch.Tensor

    def __init__(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, on: bool) -> None:
        super().__init__()
        self.net = net
        ones_x, ones_y = torch.ones(x.shape[1]), torch.ones(())
        self.register_buffer("x_mean", x.mean(0) if on else torch.zeros(x.shape[1]))
        self.register_buffer("x_std", x.std(0).clamp_min(1e-8) if on else ones_x)
        self.register_buffer("y_mean", y.mean() if on else torch.zeros(()))
        self.register_buffer("y_std", y.std().clamp_min(1e-8) if on else ones_y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net((x - self.x_mean) / self.x_std).squeeze(-1)
        return out * self.y_std + self.y_mean


class RegressionTask(Task):
    """Mean-squared error regression on the numeric columns of a CSV file."""

    config_class: ClassVar[type[RegressionConfig]] = RegressionConfig

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        config = self.section  # [task], or [task.config] under type = "custom"
        assert isinstance(config, RegressionConfig)
        self.config = config
        self.table = read_table(config)

    @property
    def train_size(self) -> int:
        return len(self.table.train_y)

    def build_model(self) -> nn.Module:
        widths = [self.table.train_x.shape[1], *self.config.hidden]
        layers: list[nn.Module] = []
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), ACTIVATIONS[self.config.activation]()]
        layers.append(nn.Linear(widths[-1], 1))
        return Standardized(
            nn.Sequential(*layers), self.table.train_x, self.table.train_y, self.config.standardize
        ).to(self.ctx.device)

    def train_batch(self, indices: torch.Tensor) -> Any:
        return move_to((self.table.train_x[indices], self.table.train_y[indices]), self.ctx.device)

    def loss(self, model: nn.Module, batch: Any) -> LossOutput:
        x, y = batch
        scale = model.y_std if isinstance(model, Standardized) else 1.0
        squared = ((model(x) - y) / scale).square()
        return LossOutput(squared.sum(), int(y.shape[0]))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        if split != "valid":
            return {}
        was_training = model.training
        model.eval()
        x, y = self.table.valid_x, self.table.valid_y
        part = rank_slice(len(y), self.ctx.rank, self.ctx.world_size)
        xs, ys = move_to((x[part], y[part]), self.ctx.device)
        error = (model(xs) - ys).double()
        sums = [
            float(error.square().sum()),
            float(len(ys)),
            float(ys.sum()),
            float(ys.square().sum()),
        ]
        sse, count, total, squares = all_reduce_sum(self.ctx, sums)
        model.train(was_training)
        mse = sse / count
        variance = squares / count - (total / count) ** 2
        return {"mse": mse, "rmse": mse**0.5, "r2": 1.0 - mse / variance if variance > 0 else 0.0}

    def summary(self) -> dict[str, Any]:
        return {
            "features": self.table.columns,
            "target": self.table.target,
            "train_rows": len(self.table.train_y),
            "valid_rows": len(self.table.valid_y),
        }
