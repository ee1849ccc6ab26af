"""`local`: one process, the whole dataset."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from shoal.strategies.base import Strategy
from shoal.training.contracts import GradientSync, LocalGradientSync


class LocalStrategy(Strategy):
    """Trains in the calling process; no process group, no communication."""

    in_process: ClassVar[bool] = True

    def attach(self, model: nn.Module) -> GradientSync:
        return LocalGradientSync(model)
