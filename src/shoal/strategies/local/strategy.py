"""`local`: one process, the whole dataset."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from shoal.strategies.base import Strategy
from shoal.strategies.local.config import LocalStrategyConfig
from shoal.training.contracts import GradientSync, LocalGradientSync


class LocalStrategy(Strategy):
    """Trains in the calling process; no process group, no communication."""

    config_class: ClassVar[type[LocalStrategyConfig]] = LocalStrategyConfig

    in_process: ClassVar[bool] = True
    state_family: ClassVar[str | None] = "learner"

    def attach(self, model: nn.Module) -> GradientSync:
        return LocalGradientSync(model)
