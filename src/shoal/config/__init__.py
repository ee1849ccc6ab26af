"""Job configuration: TOML validated by pydantic models, with help text on every field.

`ShoalConfig`, `load_config` and `dump_config` are imported on first use (PEP 562):
importing `shoal.config.base` (as every plugin's config module does) must not
assemble the root config, whose unions import those very plugin modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.config.loading import dump_config, load_config
    from shoal.config.root import ShoalConfig

__all__ = ["ShoalConfig", "dump_config", "load_config"]

_LAZY = {"ShoalConfig": "shoal.config.root", "dump_config": "shoal.config.loading"}


def __getattr__(name: str) -> Any:
    if name in ("ShoalConfig", "dump_config", "load_config"):
        import importlib

        return getattr(importlib.import_module(_LAZY.get(name, "shoal.config.loading")), name)
    raise AttributeError(f"module 'shoal.config' has no attribute {name!r}")
