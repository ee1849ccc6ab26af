"""`[monitor] wandb = {...}` and `[monitor] mlflow = {...}`: experiment trackers.

Each table, when present, sends the run's scalars (the same as TensorBoard's, see
`monitor/scalars.py`) and its resolved config to the tracker, from rank 0 (`monitor/trackers/`).
The libraries are optional extras: a config that names a tracker whose library is missing is
refused when it is validated, with the extra to install, not when the workers start.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, ValidationInfo, field_validator, model_validator

from shoal.config.base import ConfigModel


def require_module(module: str, extra: str, field: str) -> None:
    """Refuse a tracker whose library is not installed: the one line names the extra."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(
            f"the {module} package is not installed: pip install 'shoal[{extra}]' "
            f"(or remove monitor.{field})"
        )


def _local(value: str, info: ValidationInfo) -> Path:
    """A relative folder means "next to the config", as every path of a config does."""
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    return path.resolve()


def resolve_tracking_uri(value: str, info: ValidationInfo) -> str:
    """A file store's URI made absolute (`file:./mlruns` next to the config); other URIs (a
    server, a database) as they are."""
    scheme, colon, rest = value.partition(":")
    if colon and scheme != "file":
        return value
    if not colon:  # a bare folder, as MLflow takes it
        rest = value
    elif rest.startswith("//"):
        rest = urlparse(value).path
    return _local(rest, info).as_uri()


class WandbConfig(ConfigModel):
    """A Weights & Biases run per training session (a resume or a restart starts another)."""

    project: str = Field(..., min_length=1, description="W&B project the run is logged to.")
    entity: str | None = Field(
        None, description="W&B team or user (default: the logged-in user's default entity)."
    )
    name: str | None = Field(None, description="Run name (default: the run directory's name).")
    group: str | None = Field(None, description="Group the run belongs to in the W&B UI.")
    tags: list[str] = Field(default_factory=list, description="Tags of the run.")
    notes: str | None = Field(None, description="A description of the run.")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="online: sync as it runs (needs `wandb login`); offline: write the run "
        "under dir/wandb/ only (upload later with `wandb sync`); disabled: log nothing. "
        "Default: the WANDB_MODE environment variable, else online.",
    )
    dir: str | None = Field(
        None,
        description="Folder W&B writes its wandb/ folder into, relative to the config's "
        "(default: the run directory).",
    )

    @field_validator("dir")
    @classmethod
    def _resolve_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else str(_local(value, info))

    @model_validator(mode="after")
    def _installed(self) -> WandbConfig:
        require_module("wandb", "wandb", "wandb")
        return self


class MlflowConfig(ConfigModel):
    """An MLflow run per training session (a resume or a restart starts another)."""

    tracking_uri: str | None = Field(
        None,
        description="Where runs are recorded: a server ('http://host:5000'), a database "
        "('sqlite:///mlflow.db') or a folder ('file:./mlruns', next to the config; shoal "
        "sets MLFLOW_ALLOW_FILE_STORE=true for it, as MLflow 3 asks). Default: the "
        "MLFLOW_TRACKING_URI environment variable, else MLflow's default.",
    )
    experiment: str = Field(
        "Default",
        min_length=1,
        description="Experiment name, created when it does not exist yet.",
    )
    run_name: str | None = Field(None, description="Run name (default: the run directory's name).")
    tags: dict[str, str] = Field(default_factory=dict, description="Tags of the run.")

    @field_validator("tracking_uri")
    @classmethod
    def _resolve_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else resolve_tracking_uri(value, info)

    @model_validator(mode="after")
    def _installed(self) -> MlflowConfig:
        require_module("mlflow", "mlflow", "mlflow")
        return self
