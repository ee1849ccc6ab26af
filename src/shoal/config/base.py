"""The base every config model derives from.

Configs are data: strict types (a string is not silently turned into a number),
unknown keys rejected, and every field documented where it is declared, so that
`shoal config schema` and the CLI read their help text from one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo
from pydantic.fields import FieldInfo


class ConfigModel(BaseModel):
    """Strict, closed config section."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


def _resolve_existing_file(value: str, info: ValidationInfo) -> str:
    """Resolve a path against the config file's folder and require that it exists.

    Relative paths in a config mean "next to this config", whatever the current
    directory is when `shoal train` runs; the resolved config saved in the run
    directory then holds absolute paths and can be rerun from anywhere.
    """
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    path = path.resolve()
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    return str(path)


ExistingFile = Annotated[str, AfterValidator(_resolve_existing_file)]
"""A path to an existing file, relative paths taken from the config's folder."""


def _checks_file(metadata: Any) -> bool:
    return any(getattr(item, "func", None) is _resolve_existing_file for item in metadata)


def is_file_field(info: FieldInfo) -> bool:
    """Whether a config field is an `ExistingFile` (also inside `ExistingFile | None`).

    A checkpoint records the size and checksum of every such file, so a resume can tell
    when the data behind an unchanged path has changed."""
    if _checks_file(info.metadata):
        return True
    return any(
        get_origin(arg) is Annotated and _checks_file(arg.__metadata__)
        for arg in get_args(info.annotation)
    )


def fill_default_tag(data: Any, field: str, tag: str, default: str) -> Any:
    """Let a table that omits its discriminator mean the default variant.

    `optimizer = { lr = 0.1 }` is an SGD optimizer, `[task.data]` with only
    `samples = ...` is the synthetic source: the variant the field defaults to.
    """
    if isinstance(data, dict) and isinstance(data.get(field), dict) and tag not in data[field]:
        return {**data, field: {tag: default, **data[field]}}
    return data
