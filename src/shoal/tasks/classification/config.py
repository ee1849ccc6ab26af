"""`[task]` with `type = "classification"`: an MLP (or any module) trained with cross-entropy."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import (
    RESUME_FIXED,
    ConfigModel,
    ExistingFile,
    FieldError,
    TaskSection,
    fill_default_tag,
)
from shoal.errors import ShoalError
from shoal.protocols.capabilities import CLASS_LABELS, CLIENT_FILES, Capability
from shoal.tasks.user_code import FACTORY_PATTERN, FactoryOptions, import_factory


class SyntheticDataConfig(ConfigModel):
    """A deterministic synthetic problem: Gaussian clusters in a random subspace.

    Each class is a few Gaussian clusters placed on the vertices of a hypercube in
    `informative` dimensions, mixed by a random linear map into `features`
    dimensions with some pure-noise features, and a fraction `noise` of labels is
    flipped at random. A linear model cannot separate it; an MLP does well but not
    perfectly, so accuracy means something.
    """

    source: Literal["synthetic"] = "synthetic"
    samples: int = Field(10_000, ge=2, description="Number of samples (train + validation).")
    features: int = Field(32, ge=1, description="Input dimensions.", json_schema_extra=RESUME_FIXED)
    informative: int = Field(8, ge=1, description="Dimensions that carry the class signal.")
    classes: int = Field(4, ge=2, description="Number of classes.", json_schema_extra=RESUME_FIXED)
    clusters_per_class: int = Field(3, ge=1, description="Gaussian clusters per class.")
    class_sep: float = Field(1.0, gt=0, description="Distance scale between clusters.")
    noise: float = Field(0.05, ge=0, lt=1, description="Fraction of labels flipped at random.")
    seed: int = Field(0, ge=0, description="Seed of the generator (the data, not the training).")
    valid_fraction: float = Field(0.2, gt=0, lt=1, description="Share held out for validation.")

    @model_validator(mode="after")
    def _check(self) -> SyntheticDataConfig:
        if self.informative > self.features:
            raise ValueError(
                f"informative ({self.informative}) cannot exceed features ({self.features})"
            )
        if self.classes * self.clusters_per_class > 2**self.informative:
            raise ValueError(
                f"classes * clusters_per_class ({self.classes * self.clusters_per_class}) "
                f"exceeds the 2**informative = {2**self.informative} hypercube vertices"
            )
        return self


class FileDataConfig(ConfigModel):
    """Features and labels from a CSV (header row, numeric columns; .gz read too) or an NPZ file."""

    source: Literal["file"] = "file"
    path: ExistingFile = Field(..., description="CSV or NPZ file (relative to the config).")
    valid_path: ExistingFile | None = Field(
        None, description="Separate validation file; otherwise valid_fraction is held out."
    )
    valid_fraction: float = Field(
        0.2, gt=0, lt=1, description="Share held out for validation when there is no valid_path."
    )
    label_column: str | None = Field(
        None, description="CSV: name of the label column (default: the last column)."
    )
    classes: int | None = Field(
        None,
        ge=2,
        description="Number of classes (integer labels are ids 0..classes-1; named labels at "
        "most this many). Default: inferred from the labels, which are then checked for a "
        "class id far beyond the others and for classes of a single sample.",
        json_schema_extra=RESUME_FIXED,
    )
    features_key: str = Field("x", description="NPZ: name of the features array.")
    labels_key: str = Field("y", description="NPZ: name of the labels array.")
    split_seed: int = Field(0, ge=0, description="Seed of the train/validation split.")


class PythonDataConfig(FactoryOptions):
    """A user's function `module:function` that returns the datasets (and optionally the model).

    The function is called with `options` as keyword arguments and returns a dict
    with `train` and optionally `valid` (torch Datasets of `(input, label)` pairs or
    `(features, labels)` tensor pairs) and optionally `model` (any `nn.Module`
    mapping a batch of inputs to logits). Without `model`, the `[task.model]` MLP is
    built. The module is imported from the config's folder or the current directory.
    """

    source: Literal["python"] = "python"
    factory: str = Field(
        ...,
        pattern=FACTORY_PATTERN,
        description="`package.module:function` returning the datasets and optionally the model.",
    )


ClassificationDataConfig = Annotated[
    SyntheticDataConfig | FileDataConfig | PythonDataConfig, Field(discriminator="source")
]


class MLPConfig(ConfigModel):
    """A multi-layer perceptron: Linear layers with an activation and dropout between them."""

    hidden: list[Annotated[int, Field(ge=1)]] = Field(
        [128, 128],
        description="Widths of the hidden layers (empty: a linear model).",
        json_schema_extra=RESUME_FIXED,
    )
    activation: Literal["relu", "gelu", "tanh", "silu"] = Field(
        "relu", description="Activation between layers."
    )
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout probability after each hidden layer."
    )


class ClassificationTaskConfig(TaskSection):
    """Supervised classification with cross-entropy; reports loss and accuracy."""

    type: Literal["classification"] = "classification"
    data: ClassificationDataConfig = Field(
        default_factory=SyntheticDataConfig,
        description="Where the samples come from: source = synthetic (default) | file | python.",
    )
    model: MLPConfig = Field(default_factory=MLPConfig, description="The MLP to train.")

    primary_metric: ClassVar[tuple[str, str]] = ("accuracy", "max")
    tunable: ClassVar[dict[str, tuple[float, float]]] = {"dropout": (0.0, 1.0)}
    offers: ClassVar[frozenset[Capability[Any]]] = frozenset({CLASS_LABELS, CLIENT_FILES})

    @model_validator(mode="before")
    @classmethod
    def _default_source(cls, data: Any) -> Any:
        return fill_default_tag(data, "data", "source", "synthetic")

    def memory_needs(self) -> list[tuple[str, int, int]]:
        """Synthetic data is generated in float64 with a few copies at once (mixing,
        permuting, standardizing: some 24 bytes a value at the peak); data from files is
        estimated from their size (`files_memory`). The MLP's parameters are known from
        the features, the hidden widths and the classes (at least 2 when not given)."""
        data = self.data
        if isinstance(data, FileDataConfig):
            from shoal.tasks.classification.files import files_memory

            what, held, features = files_memory(data)
            classes = data.classes or 2
        elif isinstance(data, SyntheticDataConfig):
            what = f"task.data: {data.samples:,} samples x {data.features} features"
            held = 24 * data.samples * data.features + 16 * data.samples
            features, classes = data.features, data.classes
        else:
            return []
        widths = [features, *self.model.hidden, classes]
        parameters = sum((a + 1) * b for a, b in itertools.pairwise(widths))
        return [(what, held, parameters)]

    def check(self, config: Any) -> None:
        """A `source = "python"` factory imports and is a function (`shoal config validate`
        says so, not the first worker); it is called, with its options, only by the job."""
        super().check(config)
        if isinstance(self.data, PythonDataConfig):
            try:
                import_factory(self.data.factory, self.data.import_dir)
            except ShoalError as exc:
                raise FieldError(("task", "data", "factory"), str(exc)) from None
