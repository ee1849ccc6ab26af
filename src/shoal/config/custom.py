"""`type = "custom"`: a user's own strategy or task class, named by a dotted path.

    [strategy]
    type = "custom"
    class = "mypkg.coord:MyCoordinator"

    [strategy.config]        # validated by MyCoordinator.config_class
    k = 4

For one-off experiments: nothing to install, the module beside the config (or in
`import_dir`, or on `PYTHONPATH`).
The class is imported while the config is validated, so a typo in the path, a
class of the wrong type or a bad `[strategy.config]` value is reported like any
other config error (`file:line: strategy.config.k: ...`). After validation,
`config` holds the plugin's own validated config model.
"""

from __future__ import annotations

import builtins
import functools
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoal.config.base import RESUME_SAFE, ConfigModel, FieldError
from shoal.plugins.registry import Plugin, PluginError, PluginRegistry


@functools.cache
def _dotted(registry: PluginRegistry, target: str) -> Plugin:
    return Plugin(registry.kind, "custom", f"dotted path {target}", target)


def custom_plugin(registry: PluginRegistry, target: str) -> Plugin:
    """The plugin a dotted path names (imported and checked once per process)."""
    plugin = _dotted(registry, target)
    plugin.config_class()  # imports and checks the class and its config model
    return plugin


def _message(exc: PluginError, target: str) -> str:
    text = str(exc).split("): ", 1)[-1]  # drop "<kind> plugin 'custom' (dotted path ...)"
    if "cannot import" in text:
        return (
            f"{target}: {text} (put it beside the config, set import_dir, put its folder on "
            "PYTHONPATH or install its package)"
        )
    return text


def custom_section(registry: PluginRegistry) -> type[ConfigModel]:
    """The `type = "custom"` member of a kind's config union (strategies, tasks)."""
    noun = registry.kind.noun
    section = "strategy" if noun == "strategy" else noun

    class CustomConfig(ConfigModel):
        __doc__ = (
            f"A {noun} class of your own, by dotted path: class = 'module:Class', settings in "
            f"[{section}.config]."
        )
        model_config = ConfigDict(serialize_by_alias=True)

        type: Literal["custom"] = "custom"
        class_: str = Field(
            ...,
            alias="class",
            pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
            description=f"The {noun} class, 'package.module:Class' (its module importable: on "
            "PYTHONPATH or installed).",
        )
        config: Any = Field(
            default_factory=dict,
            description=f"The {noun}'s own settings, validated by its class's `config_class`.",
        )
        import_dir: str | None = Field(
            None,
            description="Folder the class's module is imported from, before PYTHONPATH "
            "(default: the config file's folder, as for a factory).",
            json_schema_extra=RESUME_SAFE,
        )

        @classmethod
        def nested_model(cls, key: str, value: Any) -> builtins.type[BaseModel] | None:
            """The model of `[section.config]` for a table naming `class` (None: unknown)."""
            target = value.get("class") if isinstance(value, dict) else None
            if key != "config" or not isinstance(target, str):
                return None
            try:
                return custom_plugin(registry, target).config_class()
            except (PluginError, ValueError):
                return None

        @model_validator(mode="after")
        def _load(self, info: Any) -> CustomConfig:
            self.import_dir = importable_from(self.import_dir, (info.context or {}).get("base_dir"))
            try:
                plugin = custom_plugin(registry, self.class_)
            except PluginError as exc:
                raise FieldError(("class",), _message(exc, self.class_)) from None
            model = plugin.config_class()
            if isinstance(self.config, model):
                return self
            if not isinstance(self.config, dict):
                raise FieldError(("config",), f"must be a table, got {self.config!r}")
            try:
                self.config = model.model_validate(self.config, context=info.context)
            except ValidationError as exc:
                raise FieldError(("config",), str(exc), exc.errors(include_url=False)) from None
            return self

    CustomConfig.__name__ = CustomConfig.__qualname__ = f"Custom{noun.title()}Config"
    return CustomConfig


def importable_from(import_dir: str | None, base_dir: str | None) -> str | None:
    """`import_dir` made absolute (relative to the config's folder `base_dir`; unset: that
    folder) and put first on `sys.path`: a class named beside the config imports as a
    factory does, in the workers too (the resolved config carries the absolute folder)."""
    if import_dir is None:
        import_dir = base_dir
    elif base_dir is not None and not Path(import_dir).is_absolute():
        import_dir = str((Path(base_dir) / import_dir).resolve())
    if import_dir is not None and import_dir not in sys.path:
        sys.path.insert(0, import_dir)
    return import_dir


def section_class(registry: PluginRegistry, section: Any) -> Any:
    """The implementation a validated `[strategy]` / `[task]` section names (or a name):
    its `type`, or with `type = "custom"` the class of its dotted path."""
    name = section if isinstance(section, str) else section.type
    if name == "custom":
        return custom_plugin(registry, section.class_).load()
    return registry.load(name)


def own_config(section: Any) -> Any:
    """A plugin's own validated config: the `[strategy]` / `[task]` section itself, or its
    `config` table when the section is `type = "custom"`. Plugins read their settings here,
    so the same class works registered by entry point or named by dotted path."""
    return section.config if getattr(section, "type", None) == "custom" else section
