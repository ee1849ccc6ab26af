"""A user's factory function named in a config: `package.module:function`, called with
the config's `options`, its module imported from the config file's folder first.

The classification task's `source = "python"` data and the module task both name one;
this is where it is found and imported, so that both say a missing module, a missing
function or a module that calls `sys.exit()` at import in the same one line.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from shoal.config.base import ConfigModel
from shoal.errors import ShoalError

#: what `factory` fields accept: `package.module:function`
FACTORY_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class FactoryOptions(ConfigModel):
    """`options` (the factory's keyword arguments) and `import_dir` (where its module is
    imported from), the latter relative to the config file's folder."""

    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the factory."
    )
    import_dir: str | None = Field(
        None,
        description="Folder the factory's module is imported from, before the current "
        "directory (default: the config file's folder).",
    )

    @model_validator(mode="after")
    def _resolve_import_dir(self, info: ValidationInfo) -> FactoryOptions:
        base = (info.context or {}).get("base_dir")
        if self.import_dir is None:
            self.import_dir = base
        elif base is not None and not Path(self.import_dir).is_absolute():
            self.import_dir = str((Path(base) / self.import_dir).resolve())
        return self


def import_factory(spec: str, import_dir: str | None) -> Callable[..., Any]:
    """`module:function`, its module imported from `import_dir` first, then the cwd."""
    module_name, _, function_name = spec.partition(":")
    for folder in (str(Path.cwd()), import_dir):
        if folder is not None and folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ShoalError(f"cannot import {module_name!r}: {exc}") from None
    except SystemExit as exc:
        raise ShoalError(f"importing {module_name!r} called sys.exit({exc.code})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ShoalError(f"module {module_name!r} has no function {function_name!r}")
    return function
