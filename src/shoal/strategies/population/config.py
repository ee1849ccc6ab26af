"""`[strategy] type = "population_based"`: population, generations, exploit, explore, search space.

```toml
[strategy]
type = "population_based"
population_size = 8
workers = 2
ready_interval = 50
exploit = { method = "truncation", fraction = 0.25 }
explore = { method = "perturbation", factor = 0.2 }

[strategy.search_space]
lr = { kind = "log", low = 1e-4, high = 1.0 }
momentum = { kind = "linear", low = 0.5, high = 0.99 }
dropout = { kind = "choice", values = [0.0, 0.1, 0.2, 0.3] }
```
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import (
    RESUME_FIXED,
    RESUME_SAFE,
    ConfigModel,
    FieldError,
    StrategySection,
    fill_default_tag,
)
from shoal.shape.hosts import Hosts
from shoal.shape.roles import RankRoles
from shoal.strategies.population.knobs import check_search_space, primary_metric, resolve_metric


class _Range(ConfigModel):
    """Values between `low` and `high`."""

    low: float = Field(..., description="Smallest value.")
    high: float = Field(..., description="Largest value.")

    @model_validator(mode="after")
    def _ordered(self) -> _Range:
        if self.high <= self.low:
            raise ValueError(f"high ({self.high:g}) must exceed low ({self.low:g})")
        return self

    def bounds(self) -> tuple[float, float]:
        """The smallest and largest value."""
        return self.low, self.high


class LogRange(_Range):
    """Values between `low` and `high`, drawn uniformly in log space (for lr, weight decay)."""

    kind: Literal["log"] = "log"
    low: float = Field(..., gt=0, description="Smallest value (> 0).")
    high: float = Field(..., gt=0, description="Largest value.")


class LinearRange(_Range):
    """Values between `low` and `high`, drawn uniformly (for momentum, dropout)."""

    kind: Literal["linear"] = "linear"


class Choice(ConfigModel):
    """One of a list of values; perturbation moves to a neighbour in the list."""

    kind: Literal["choice"] = "choice"
    values: list[float] = Field(
        ..., min_length=2, description="The values, in the order perturbation walks them."
    )

    def bounds(self) -> tuple[float, float]:
        """The smallest and largest value."""
        return min(self.values), max(self.values)


Distribution = Annotated[LogRange | LinearRange | Choice, Field(discriminator="kind")]


class TruncationConfig(ConfigModel):
    """The bottom `fraction` of the population copies members drawn from the top `fraction`."""

    method: Literal["truncation"] = "truncation"
    fraction: float = Field(
        0.25,
        gt=0,
        le=0.5,
        description="Share of the population replaced each generation: the worst "
        "ceil(fraction * population_size) copy members of the best as many.",
    )


class BinaryConfig(ConfigModel):
    """Binary tournament: each member meets a random other and copies it when clearly worse."""

    method: Literal["binary"] = "binary"
    threshold: float = Field(
        0.0,
        ge=0,
        description="Copy the other member when this one's score is worse by more than this "
        "(in the metric's units).",
    )


ExploitConfig = Annotated[TruncationConfig | BinaryConfig, Field(discriminator="method")]


class PerturbationConfig(ConfigModel):
    """Multiply each hyperparameter by 1 - factor or 1 + factor (a choice moves one step)."""

    method: Literal["perturbation"] = "perturbation"
    factor: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Relative change: a value becomes x(1 - factor) or x(1 + factor).",
    )


class ResampleConfig(ConfigModel):
    """Redraw each hyperparameter from the search space with `probability`, else perturb it."""

    method: Literal["resample"] = "resample"
    probability: float = Field(
        1.0, gt=0, le=1, description="Chance that a hyperparameter is redrawn from its range."
    )
    factor: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="Perturbation of the hyperparameters that are not redrawn (0: keep them).",
    )


ExploreConfig = Annotated[PerturbationConfig | ResampleConfig, Field(discriminator="method")]


class PopulationStrategyConfig(StrategySection):
    """Population-based training: members train in generations, then exploit and explore."""

    type: Literal["population_based"] = "population_based"
    workers_field: ClassVar[str | None] = "workers"
    in_process: ClassVar[bool] = True
    population_size: int = Field(
        8,
        ge=2,
        description="Members of the population (may exceed workers: they time-share).",
        json_schema_extra=RESUME_FIXED,
    )
    workers: int = Field(
        1,
        ge=1,
        description="Worker processes `shoal train` starts on this machine; members are "
        "dealt round-robin to them (`--workers` overrides it).",
        json_schema_extra=RESUME_SAFE,
    )
    balance: Literal["static", "dynamic"] = Field(
        "static",
        description="Where members train: static (member m on worker m mod workers) or dynamic "
        "(after each generation, members are re-placed by the workers' measured step times, "
        "moving with their whole state; what each member computes does not change).",
        json_schema_extra=RESUME_SAFE,
    )
    ready_interval: int = Field(
        100, ge=1, description="Training steps of every member between exploit/explore rounds."
    )
    generations: int | None = Field(
        None,
        ge=1,
        description="Generations to train; each member then trains generations * "
        "ready_interval steps, at most the [train] budget (default: the [train] budget).",
        json_schema_extra=RESUME_SAFE,
    )
    metric: str | None = Field(
        None,
        description="Evaluation metric that ranks members (default: the task's, e.g. accuracy).",
    )
    mode: Literal["max", "min"] | None = Field(
        None, description="Whether a higher (max) or lower (min) metric is better."
    )
    split: str = Field("valid", description="Held-out split the metric is measured on.")
    exploit: ExploitConfig = Field(
        default_factory=TruncationConfig,
        description="How weak members take over strong ones: method = truncation | binary.",
    )
    explore: ExploreConfig = Field(
        default_factory=PerturbationConfig,
        description="How copied hyperparameters change: method = perturbation | resample.",
    )
    search_space: dict[str, Distribution] = Field(
        ...,
        min_length=1,
        description="Hyperparameters tuned, by name (lr, momentum, weight_decay, beta1, beta2, "
        "and task parameters such as dropout): kind = log | linear | choice.",
    )
    checkpoint_every: int = Field(
        1,
        ge=0,
        description="Write a checkpoint every N generations (0: only at the end); the "
        "[checkpoint] every_steps and every_epochs settings do not apply.",
        json_schema_extra=RESUME_SAFE,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_methods(cls, data: Any) -> Any:
        data = fill_default_tag(data, "exploit", "method", "truncation")
        return fill_default_tag(data, "explore", "method", "perturbation")

    @model_validator(mode="after")
    def _check(self) -> PopulationStrategyConfig:
        if self.workers > self.population_size:
            raise ValueError(
                f"workers ({self.workers}) exceeds population_size ({self.population_size}): "
                "every worker needs a member; use at most population_size workers"
            )
        return self

    def roles(self, hosts: Hosts | None) -> RankRoles:
        """Member m lives on worker m mod workers; every worker holds one at least."""
        field = "strategy.population_size"
        return RankRoles.hosting(self.workers, "member", self.population_size, items_field=field)

    def check(self, config: Any) -> None:
        """The loop's length; a schedule members can follow; a search space this job can
        tune; a metric whose direction is known."""
        super().check(config)
        if config.train.lr_decay == "plateau":
            raise FieldError(
                ("train", "lr_decay"),
                '"plateau" follows the trainer\'s validation, which population members do not '
                "run; use constant, linear or cosine (and tune lr in the search space)",
            )
        check_search_space(config)
        resolve_metric(self, primary_metric(config))
