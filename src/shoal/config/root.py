"""The whole job description: one model per TOML section."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from shoal.config.base import ConfigModel
from shoal.config.sections import CheckpointConfig, FaultsConfig, MonitorConfig, RunConfig
from shoal.config.strategy import LocalStrategyConfig, StrategyConfig
from shoal.config.train import TrainConfig
from shoal.tasks.classification.config import ClassificationTaskConfig
from shoal.tasks.kge.config import KGETaskConfig

# Further tasks join this union, discriminated by `type`.
TaskConfig = Annotated[ClassificationTaskConfig | KGETaskConfig, Field(discriminator="type")]


class ShoalConfig(ConfigModel):
    """A training job: what to train ([task]), how to distribute it ([strategy]), how long."""

    task: TaskConfig = Field(..., description="What is trained: model, data and loss.")
    strategy: StrategyConfig = Field(
        default_factory=LocalStrategyConfig,
        description="How the work is distributed: type = local | data_parallel.",
    )
    train: TrainConfig = Field(..., description="Optimization: steps, batch, optimizer.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="When checkpoints are written."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="Run directory and devices.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Progress and logs.")
    faults: FaultsConfig = Field(
        default_factory=FaultsConfig, description="Timeouts and fault injection."
    )
