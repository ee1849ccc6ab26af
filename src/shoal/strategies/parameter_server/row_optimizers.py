"""Server-side optimizers that update only the rows a push names.

A row's state lives next to the row in the shard, so checkpoints and
re-sharding move it with the row. Every update takes unique row positions (the
worker coalesced duplicates; a sync clock's pushes are coalesced again before
the update), so an index assignment never races with itself.
"""

from __future__ import annotations

import torch

from shoal.strategies.parameter_server.config import (
    LazyAdamConfig,
    RowAdagradConfig,
    RowOptimizerConfig,
)


class RowOptimizer:
    """Plain SGD: w -= lr * g. Subclasses add per-row state (named tensors, one row per row)."""

    def __init__(self, config: RowOptimizerConfig) -> None:
        self.config = config
        self.lr = config.lr

    def new_state(self, rows: int, width: int) -> dict[str, torch.Tensor]:
        return {}

    def apply(
        self,
        table: torch.Tensor,
        state: dict[str, torch.Tensor],
        index: torch.Tensor,
        grad: torch.Tensor,
    ) -> None:
        table.index_add_(0, index, grad, alpha=-self.lr)


class RowAdagrad(RowOptimizer):
    """Row-wise Adagrad (PyTorch-BigGraph, DGL-KE): s_i += mean_j g_ij^2;
    w_i -= lr * g_i / (sqrt(s_i) + eps). One float of state per row."""

    def new_state(self, rows: int, width: int) -> dict[str, torch.Tensor]:
        return {"sum": torch.zeros(rows)}

    def apply(
        self,
        table: torch.Tensor,
        state: dict[str, torch.Tensor],
        index: torch.Tensor,
        grad: torch.Tensor,
    ) -> None:
        assert isinstance(self.config, RowAdagradConfig)
        total = state["sum"]
        total.index_add_(0, index, grad.pow(2).mean(dim=1))
        scale = self.lr / (total[index].sqrt() + self.config.eps)
        table.index_add_(0, index, grad * scale[:, None], alpha=-1.0)


class LazyAdam(RowOptimizer):
    """Adam whose moments and bias correction advance per row, only when it is pushed."""

    def new_state(self, rows: int, width: int) -> dict[str, torch.Tensor]:
        return {
            "m": torch.zeros(rows, width),
            "v": torch.zeros(rows, width),
            "step": torch.zeros(rows),
        }

    def apply(
        self,
        table: torch.Tensor,
        state: dict[str, torch.Tensor],
        index: torch.Tensor,
        grad: torch.Tensor,
    ) -> None:
        assert isinstance(self.config, LazyAdamConfig)
        beta1, beta2 = self.config.betas
        m = state["m"][index].lerp_(grad, 1 - beta1)  # beta1 m + (1 - beta1) g
        v = state["v"][index].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"][index].add_(1)
        state["m"].index_copy_(0, index, m)
        state["v"].index_copy_(0, index, v)
        state["step"].index_copy_(0, index, step)
        # m_hat / (sqrt(v_hat) + eps), in place on the gathered copies (already stored)
        denominator = v.mul_((1 / (1 - beta2**step))[:, None]).sqrt_().add_(self.config.eps)
        update = m.mul_((1 / (1 - beta1**step))[:, None]).div_(denominator)
        table.index_add_(0, index, update, alpha=-self.lr)


def build_row_optimizer(config: RowOptimizerConfig) -> RowOptimizer:
    kinds: dict[str, type[RowOptimizer]] = {
        "sgd": RowOptimizer,
        "adagrad": RowAdagrad,
        "lazy_adam": LazyAdam,
    }
    return kinds[config.kind](config)
