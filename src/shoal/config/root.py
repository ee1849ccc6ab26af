"""The whole job description: one model per TOML section."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from shoal.config.base import ConfigModel
from shoal.config.sections import CheckpointConfig, FaultsConfig, MonitorConfig, RunConfig
from shoal.config.strategy import LocalStrategyConfig, StrategyConfig
from shoal.config.train import SGDConfig, TrainConfig
from shoal.tasks.classification.config import ClassificationTaskConfig
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.lm.config import LMTaskConfig

# Further tasks join this union, discriminated by `type`.
TaskConfig = Annotated[
    ClassificationTaskConfig | KGETaskConfig | LMTaskConfig, Field(discriminator="type")
]


class ShoalConfig(ConfigModel):
    """A training job: what to train ([task]), how to distribute it ([strategy]), how long."""

    task: TaskConfig = Field(..., description="What is trained: model, data and loss.")
    strategy: StrategyConfig = Field(
        default_factory=LocalStrategyConfig,
        description="How the work is distributed: type = local | data_parallel | federated "
        "| population_based.",
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

    # Rules that span sections. A strategy config may define `check_train(train)` and
    # `check_faults(faults)` (raising ValueError) for rules of its own; the message is
    # then reported at `train` or `faults`.
    @field_validator("train")
    @classmethod
    def _training_length(cls, train: TrainConfig, info: ValidationInfo) -> TrainConfig:
        if "strategy" not in info.data:
            return train  # the strategy is invalid: its own error says so
        check = getattr(info.data["strategy"], "check_train", None)
        if check is not None:
            check(train)
        elif train.epochs is None and train.max_steps is None:
            raise ValueError("set epochs or max_steps (or both: whichever comes first)")
        return train

    @field_validator("faults")
    @classmethod
    def _strategy_faults(cls, faults: FaultsConfig, info: ValidationInfo) -> FaultsConfig:
        check = getattr(info.data.get("strategy"), "check_faults", None)
        if check is not None:
            check(faults)
        return faults

    @field_validator("train")
    @classmethod
    def _momentum_in_one_place(cls, train: TrainConfig, info: ValidationInfo) -> TrainConfig:
        """Deep Gradient Compression applies momentum before sparsifying: not a second time."""
        aggregation = getattr(info.data.get("strategy"), "aggregation", None)
        compression = getattr(aggregation, "compression", None)
        if getattr(compression, "momentum_correction", 0.0) and not (
            isinstance(train.optimizer, SGDConfig) and train.optimizer.momentum == 0
        ):
            raise ValueError(
                "strategy.aggregation.compression.momentum_correction applies momentum before "
                'sparsification: use optimizer kind = "sgd" with momentum = 0'
            )
        return train
