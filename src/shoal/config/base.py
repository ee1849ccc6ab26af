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

    def check(self, config: Any) -> None:
        """Rules between this section and the rest of the job (`config`, the whole validated
        ShoalConfig): raise `FieldError` with the path, from the top, of the field to blame.

        Run once every section is valid, for the `[strategy]` and `[task]` sections; a
        section passes it on to its parts that have rules of their own (data_parallel to
        its aggregation, which passes it to its compression). One place per plugin, so
        the top-level config never looks inside a section it does not own."""


def resolve_existing_file(value: str, info: ValidationInfo, kind: str = "file") -> str:
    """Resolve a path against the config file's folder and require that it exists (a
    file; with `kind = "folder"`, a file or a folder).

    Relative paths in a config mean "next to this config", whatever the current
    directory is when `shoal train` runs; the resolved config saved in the run
    directory then holds absolute paths and can be rerun from anywhere.
    """
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    path = path.resolve()
    if not (path.is_file() or (kind == "folder" and path.is_dir())):
        raise ValueError(f"{kind} not found: {path}")
    return str(path)


ExistingFile = Annotated[str, AfterValidator(resolve_existing_file)]
"""A path to an existing file, relative paths taken from the config's folder."""


def _checks_file(metadata: Any) -> bool:
    return any(getattr(item, "func", None) is resolve_existing_file for item in metadata)


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


class FieldError(ValueError):
    """A rule broken at a field *below* the validator that found it.

    A model's validator (or a plugin's `check`) that sees a problem in one of its
    fields, or in the section of another, raises this with the path of that field
    from the model being validated (`("class",)`, `("config", "k")`): the error
    message then names that field and its line, not the whole table. `errors`
    carries a nested model's own validation errors (their `loc` relative to `path`).
    """

    def __init__(
        self, path: tuple[str | int, ...], message: str, errors: list[Any] | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.errors = errors or []


def field_key(name: str, info: FieldInfo) -> str:
    """The key a field is written as in TOML: its alias when it has one (`class`)."""
    return info.alias or name


def fields_by_key(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key a config file writes them as."""
    return {field_key(name, info): info for name, info in model.model_fields.items()}


class StrategySection(ConfigModel):
    """The base of `[strategy]` sections whose strategy runs shoal's shared training loop."""

    def check(self, config: Any) -> None:
        """The shared loop needs a length: epochs, max_steps or both."""
        train = config.train
        if train.epochs is None and train.max_steps is None:
            raise FieldError(("train",), "set epochs or max_steps (or both: whichever comes first)")
