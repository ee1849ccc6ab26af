"""The whole job description: one model per TOML section.

`[task]` and `[strategy]` are unions of the config models of every registered
task and strategy (`shoal.plugins.kinds`: shoal's own and installed plugins),
discriminated by `type`; config never imports a strategy or a task itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from shoal.config.base import RESUME_FIXED, RESUME_SAFE, ConfigModel, FieldError
from shoal.config.custom import custom_section, own_config
from shoal.config.sections import CheckpointConfig, FaultsConfig, MonitorConfig, RunConfig
from shoal.config.train import TrainConfig
from shoal.plugins.kinds import STRATEGIES, TASKS
from shoal.protocols.capabilities import SHARD_UNITS

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


def _watching(section: type[ConfigModel], description: str) -> Any:
    """A section around the training a resume may change freely, all defaults allowed."""
    return Field(default_factory=section, description=description, json_schema_extra=RESUME_SAFE)


class ShoalConfig(ConfigModel):
    """A training job: what to train ([task]), how to distribute it ([strategy]), how long."""

    task: TaskConfig = Field(
        ..., description="What is trained: model, data and loss.", json_schema_extra=RESUME_FIXED
    )
    strategy: StrategyConfig = Field(
        default_factory=_LOCAL, description=_strategy_help(), json_schema_extra=RESUME_FIXED
    )
    train: TrainConfig = Field(..., description="Optimization: steps, batch, optimizer.")
    # how often, where and how it is watched: a resume may change any of it
    checkpoint: CheckpointConfig = _watching(CheckpointConfig, "When checkpoints are written.")
    run: RunConfig = _watching(RunConfig, "Run directory and devices.")
    monitor: MonitorConfig = _watching(MonitorConfig, "Progress and logs.")
    faults: FaultsConfig = _watching(FaultsConfig, "Timeouts and fault injection.")

    @model_validator(mode="after")
    def _across_sections(self) -> ShoalConfig:
        """Each plugin's own rules between sections: its config's `check` (see ConfigModel);
        then the elastic floor against the job's shape."""
        for section in (self.task, self.strategy):  # the task first: a strategy asks it
            check = getattr(own_config(section), "check", None)
            if check is not None:
                check(self)
        self._check_floor()
        self._check_backend()
        self._check_block_options()
        return self

    def _check_backend(self) -> None:
        """A job whose workers share GPUs talks through gloo: NCCL refuses two ranks on
        one device."""
        if self.run.backend != "nccl":
            return
        section = own_config(self.strategy)
        shape = getattr(section, "shape", None)
        if shape is not None and shape(self).shares_gpus:
            raise FieldError(
                ("run", "backend"),
                f"strategy '{self.strategy.type}' talks through gloo (its workers may share "
                'a GPU, which NCCL refuses); set run.backend = "auto" or "gloo"',
            )

    def _check_block_options(self) -> None:
        """Activation checkpointing and compile apply to a model's repeated blocks, under
        the strategies whose loop builds the model."""
        train = self.train
        chosen = [name for name in ("activation_checkpointing", "compile") if getattr(train, name)]
        if not chosen:
            return
        field = ("train", chosen[0])
        if not getattr(own_config(self.strategy), "block_options", False):
            raise FieldError(
                field,
                f"strategy '{self.strategy.type}' builds its models in a loop of its own; "
                "it applies under local, data_parallel, fully_sharded, tensor_parallel, "
                "hybrid and pipeline",
            )
        if SHARD_UNITS.lacked_by(self.task) is not None:
            raise FieldError(
                field,
                f"task type '{self.task.type}' has no repeated blocks to apply it to (a "
                "transformer's layers); remove it",
            )

    def _check_floor(self) -> None:
        """`faults.min_workers` needs a strategy that can go on with fewer workers, and no
        more workers than the job has."""
        floor = self.faults.min_workers
        if not floor:
            return
        section = own_config(self.strategy)
        if not getattr(section, "elastic", False):
            raise FieldError(
                ("faults", "min_workers"),
                f"strategy '{self.strategy.type}' cannot go on with fewer workers than it "
                "started with; remove min_workers (restarts keep every worker)",
            )
        workers = section.shape(self).workers
        if floor > workers:
            raise FieldError(
                ("faults", "min_workers"),
                f"{floor} is more than the job's {workers} workers; set it to at most "
                f"{workers} (0: never shrink)",
            )
