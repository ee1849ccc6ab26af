"""shoal: one training job, every way to distribute it.

The names below are imported on first use (PEP 562), so `shoal --help` and
`import shoal.config` do not import torch and every strategy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ShoalConfig", "ShoalError", "__version__", "load_config", "train"]

if TYPE_CHECKING:
    __version__: str
    from shoal.api import train
    from shoal.config import ShoalConfig, load_config
    from shoal.errors import ShoalError

_LAZY = {
    "train": "shoal.api",
    "ShoalConfig": "shoal.config",
    "load_config": "shoal.config",
    "ShoalError": "shoal.errors",
}


def _installed_version() -> str:
    """pyproject.toml's version, as installed: the one source of truth for `shoal --version`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shoal")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read once, on first use: `import shoal` stays light
        globals()["__version__"] = _installed_version()
        return globals()["__version__"]
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")
