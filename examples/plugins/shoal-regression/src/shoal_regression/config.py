"""`[task] type = "regression"`: a CSV file, the target column, and an MLP (or a linear model)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from shoal.extend import RESUME_FIXED, ExistingFile, TaskSection


class RegressionConfig(TaskSection):
    """Regression: predict a numeric column of a CSV file; mean-squared error."""

    #: the class shoal runs for this config (the entry point names this config class)
    implementation: ClassVar[str] = "shoal_regression.task:RegressionTask"
    #: the metric that picks the best model, and its direction
    primary_metric: ClassVar[tuple[str, str]] = ("mse", "min")

    type: Literal["regression"] = "regression"
    path: ExistingFile = Field(
        ...,
        description="CSV file with a header row; every column a number (relative to the config).",
    )
    target: str | None = Field(
        None,
        description="The column to predict (default: the last).",
        json_schema_extra=RESUME_FIXED,
    )
    valid_fraction: float = Field(
        0.2, gt=0, lt=1, description="Share of the rows held out for validation (seeded split)."
    )
    seed: int = Field(0, ge=0, description="Seed of the train/valid split.")
    hidden: list[int] = Field(
        [32],
        description="Widths of the hidden layers ([]: a linear model).",
        json_schema_extra=RESUME_FIXED,
    )
    activation: Literal["relu", "tanh", "gelu"] = Field(
        "tanh", description="Activation between hidden layers."
    )
    standardize: bool = Field(
        True,
        description="Scale features and target to mean 0, variance 1 (from the training rows); "
        "reported errors are in the target's own units.",
    )

    @model_validator(mode="after")
    def _widths(self) -> RegressionConfig:
        if any(width < 1 for width in self.hidden):
            raise ValueError(f"hidden: every width must be >= 1, got {self.hidden}")
        return self
