"""Server-side optimizers that update only the rows a push names.

A row's state lives next to the row in the shard, so checkpoints and
re-sharding move it with the row. Every update takes unique row positions (the
worker coalesced duplicates; a sync clock's pushes are coalesced again before
the update), so an index assignment never races with itself.

No update passes `alpha` to `index_add_`: on CPU any alpha but 1 takes a path
that adds row by row: 2.4x slower for 3,000 rows of 64 in a table of 5M rows
(`benchmarks/row_update.py`); the source is scaled first instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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

    def new_state(
        self, rows: int, width: int, zeros: Callable[..., torch.Tensor] = torch.zeros
    ) -> dict[str, torch.Tensor]:
        """The state of `rows` rows of `width`, made by `zeros(*shape)` (where it lives:
        storage.py)."""
        return {}

    def apply(
        self,
        table: torch.Tensor,
        state: dict[str, torch.Tensor],
        index: torch.Tensor,
        grad: torch.Tensor,
    ) -> None:
        table.index_add_(0, index, grad * -self.lr)


class RowAdagrad(RowOptimizer):
    """Row-wise Adagrad (PyTorch-BigGraph, DGL-KE): s_i += mean_j g_ij^2;
    w_i -= lr * g_i / (sqrt(s_i) + eps). One float of state per row."""

    def new_state(
        self, rows: int, width: int, zeros: Callable[..., torch.Tensor] = torch.zeros
    ) -> dict[str, torch.Tensor]:
        return {"sum": zeros(rows)}

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
        scale = -self.lr / (total[index].sqrt() + self.config.eps)
        table.index_add_(0, index, grad * scale[:, None])


class LazyAdam(RowOptimizer):
    """Lazy Adam (torch's SparseAdam, TensorFlow's LazyAdam): a row's moments change only
    when it is pushed; the bias correction follows the table's update count t, as there.

    Each row keeps the t of its last update (`step`), so a checkpoint, and a re-sharded
    resume, carry t along: a shard's t is the largest it holds.
    """

    def __init__(self, config: RowOptimizerConfig) -> None:
        super().__init__(config)
        self._updates: dict[int, float] = {}  # per table (its `step` tensor): updates so far

    def new_state(
        self, rows: int, width: int, zeros: Callable[..., torch.Tensor] = torch.zeros
    ) -> dict[str, torch.Tensor]:
        return {"m": zeros(rows, width), "v": zeros(rows, width), "step": zeros(rows)}

    def apply(
        self,
        table: torch.Tensor,
        state: dict[str, torch.Tensor],
        index: torch.Tensor,
        grad: torch.Tensor,
    ) -> None:
        assert isinstance(self.config, LazyAdamConfig)
        beta1, beta2 = self.config.betas
        key = id(state["step"])
        if key not in self._updates:  # first update of this table (or after a resume)
            self._updates[key] = float(state["step"].max()) if len(state["step"]) else 0.0
        t = self._updates[key] = self._updates[key] + 1
        m = state["m"][index].lerp_(grad, 1 - beta1)  # beta1 m + (1 - beta1) g
        v = state["v"][index].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        state["m"].index_copy_(0, index, m)
        state["v"].index_copy_(0, index, v)
        state["step"].index_fill_(0, index, t)
        # SparseAdam's form: lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps),
        # in place on the gathered copies (already stored)
        step_size = self.lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
        table.index_add_(0, index, m.div_(v.sqrt_().add_(self.config.eps)).mul_(-step_size))


def build_row_optimizer(config: RowOptimizerConfig) -> RowOptimizer:
    kinds: dict[str, type[RowOptimizer]] = {
        "sgd": RowOptimizer,
        "adagrad": RowAdagrad,
        "lazy_adam": LazyAdam,
    }
    return kinds[config.kind](config)
