"""The whole job description: one model per TOML section.

`[task]` and `[strategy]` are unions of the config models of every registered
task and strategy (`shoal.plugins.kinds`: shoal's own and installed plugins),
discriminated by `type`; config never imports a strategy or a task itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from shoal.config.base import ConfigModel
from shoal.config.custom import custom_section, own_config
from shoal.config.sections import CheckpointConfig, FaultsConfig, MonitorConfig, RunConfig
from shoal.config.train import TrainConfig
from shoal.plugins.kinds import STRATEGIES, TASKS

if TYPE_CHECKING:  # assembled at run time: a plugin's section is any model with a `type`
    TaskConfig = Any
    StrategyConfig = Any
else:
    TaskConfig = TASKS.config_union(custom_section(TASKS))
    StrategyConfig = STRATEGIES.config_union(custom_section(STRATEGIES))
_LOCAL = STRATEGIES.get("local").config_class()


def _strategy_help() -> str:
    names = " | ".join(STRATEGIES.names())
    return f'How the work is distributed: type = {names}, or "custom" with class = "module:Class".'


class ShoalConfig(ConfigModel):
    """A training job: what to train ([task]), how to distribute it ([strategy]), how long."""

    task: TaskConfig = Field(..., description="What is trained: model, data and loss.")
    strategy: StrategyConfig = Field(default_factory=_LOCAL, description=_strategy_help())
    train: TrainConfig = Field(..., description="Optimization: steps, batch, optimizer.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="When checkpoints are written."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="Run directory and devices.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Progress and logs.")
    faults: FaultsConfig = Field(
        default_factory=FaultsConfig, description="Timeouts and fault injection."
    )

    @model_validator(mode="after")
    def _across_sections(self) -> ShoalConfig:
        """Each plugin's own rules between sections: its config's `check` (see ConfigModel)."""
        for section in (self.strategy, self.task):
            check = getattr(own_config(section), "check", None)
            if check is not None:
                check(self)
        return self
