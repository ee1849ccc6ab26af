"""`local`: one process, the whole dataset."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from shoal.strategies.base import LEARNERS, Strategy
from shoal.strategies.local.config import LocalStrategyConfig
from shoal.training.contracts import GradientSync, LocalGradientSync


class LocalStrategy(Strategy):
    """Trains in the calling process; no process group, no communication."""

    config_class: ClassVar[type[LocalStrategyConfig]] = LocalStrategyConfig

    in_process: ClassVar[bool] = True
    #: the learner family loads each other's checkpoints; a pipeline saves the whole model
    #: and one optimizer state in this layout
    resumes_from: ClassVar[tuple[str, ...]] = (*LEARNERS, "pipeline")

    def attach(self, model: nn.Module) -> GradientSync:
        return LocalGradientSync(model)
